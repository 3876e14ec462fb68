package lakehouse.sql;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;
import javax.security.sasl.AuthenticationException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class PasswordFileTest {
  static String line(String user, String password, int iterations) {
    byte[] salt = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);
    byte[] hash = PasswordFile.pbkdf2(password, salt, iterations);
    Base64.Encoder b64 = Base64.getEncoder();
    return user + ":pbkdf2_sha256$" + iterations + "$" + b64.encodeToString(salt) + "$"
        + b64.encodeToString(hash);
  }

  @AfterEach
  void noPasswordFile() {
    System.clearProperty(PasswordFileAuthenticator.FILE_PROPERTY);
  }

  @Test
  void theRightPasswordOfAKnownUserOnly() {
    PasswordFile users =
        PasswordFile.parse(List.of("# BI users", "", line("analyst", "s3cret pässword", 1000)));
    assertEquals(1, users.size());
    assertTrue(users.verify("analyst", "s3cret pässword"));
    assertFalse(users.verify("analyst", "s3cret password"));
    assertFalse(users.verify("analyst", ""));
    assertFalse(users.verify("analyst", null));
    assertFalse(users.verify("someone", "s3cret pässword"));
    assertFalse(users.verify(null, "s3cret pässword"));
  }

  @Test
  void aLineThatIsNotAUserNamesItsNumber() {
    IllegalArgumentException bad =
        assertThrows(
            IllegalArgumentException.class,
            () -> PasswordFile.parse(List.of(line("a", "pw", 1000), "b:plain-password")));
    assertEquals("line 2 is not user:pbkdf2_sha256$<iterations>$<salt>$<hash>", bad.getMessage());
    IllegalArgumentException twice =
        assertThrows(
            IllegalArgumentException.class,
            () -> PasswordFile.parse(List.of(line("a", "pw", 1000), line("a", "other", 1000))));
    assertEquals("line 2: user a twice", twice.getMessage());
    assertThrows(
        IllegalArgumentException.class, () -> PasswordFile.parse(List.of(line("a", "pw", 10))));
  }

  @Test
  void theAuthenticatorReadsTheFileAtEveryLogin(@TempDir Path dir) throws Exception {
    Path file = dir.resolve("users");
    Files.writeString(file, line("analyst", "pw-one", 1000) + "\n");
    System.setProperty(PasswordFileAuthenticator.FILE_PROPERTY, file.toString());
    PasswordFileAuthenticator login = new PasswordFileAuthenticator();
    login.Authenticate("analyst", "pw-one");
    assertThrows(AuthenticationException.class, () -> login.Authenticate("analyst", "pw-two"));
    Files.writeString(file, line("analyst", "pw-two", 1000) + "\n");
    login.Authenticate("analyst", "pw-two");
    assertThrows(AuthenticationException.class, () -> login.Authenticate("analyst", "pw-one"));
  }

  @Test
  void withoutAReadableFileNobodyLogsIn(@TempDir Path dir) {
    PasswordFileAuthenticator login = new PasswordFileAuthenticator();
    assertThrows(AuthenticationException.class, () -> login.Authenticate("analyst", "pw"));
    System.setProperty(PasswordFileAuthenticator.FILE_PROPERTY, dir.resolve("none").toString());
    assertThrows(AuthenticationException.class, () -> login.Authenticate("analyst", "pw"));
  }
}
