package lakehouse.sql;

import java.io.IOException;
import java.nio.file.Paths;
import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Thrift server's login check ({@code hive.server2.authentication=CUSTOM}): the user and
 * password a client sends must be in the password file the system property
 * {@value #FILE_PROPERTY} names (lakehouse serve-sql sets it from the setting sql.auth_file; no
 * password is ever on a command line). The file is read at every login, so users added or
 * removed apply to the next connection without a restart.
 *
 * <p>The server makes a new instance per login (Hive's CustomAuthenticationProviderImpl, from a
 * new HiveConf: hence system properties, which clients cannot change, see
 * {@link ClientProofProperties}).
 */
public final class PasswordFileAuthenticator implements PasswdAuthenticationProvider {
  public static final String FILE_PROPERTY = "lakehouse.sql.passwords";
  private static final Logger LOG = LoggerFactory.getLogger(PasswordFileAuthenticator.class);

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String file = System.getProperty(FILE_PROPERTY);
    if (file == null || file.isEmpty()) {
      LOG.error("login refused: no password file ({} is not set)", FILE_PROPERTY);
      throw new AuthenticationException("the server has no password file");
    }
    PasswordFile users;
    try {
      users = PasswordFile.read(Paths.get(file));
    } catch (IOException | IllegalArgumentException e) {
      LOG.error("login refused: cannot read the password file {}: {}", file, e.getMessage());
      throw new AuthenticationException("the server cannot read its password file");
    }
    if (!users.verify(user, password)) {
      LOG.warn("login refused: wrong user or password for user {}", user);
      throw new AuthenticationException("wrong user or password");
    }
  }
}
