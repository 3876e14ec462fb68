package lakehouse.sql;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;

/**
 * The users of the JDBC server and their password hashes: one {@code user:hash} per line, blank
 * lines and lines starting with {@code #} ignored. A hash is
 * {@code pbkdf2_sha256$<iterations>$<salt, base64>$<PBKDF2-HMAC-SHA256 of the UTF-8 password,
 * 32 bytes, base64>}, what {@code lakehouse sql-passwd} writes (lakehouse/tools/sqlauth.py): no
 * password is stored, and a leaked file costs an attacker that many HMACs per guess.
 */
public final class PasswordFile {
  public static final String SCHEME = "pbkdf2_sha256";
  static final int HASH_BYTES = 32;
  private static final Pattern LINE =
      Pattern.compile(
          "^([A-Za-z0-9_.@-]{1,128}):"
              + SCHEME
              + "\\$(\\d{1,9})\\$([A-Za-z0-9+/=]+)\\$([A-Za-z0-9+/=]+)$");
  // an unknown user costs what a known one does: the answer's time does not say who exists
  private static final Entry NOBODY = new Entry(100_000, new byte[16], new byte[HASH_BYTES]);

  private final Map<String, Entry> users;

  private PasswordFile(Map<String, Entry> users) {
    this.users = users;
  }

  static final class Entry {
    final int iterations;
    final byte[] salt;
    final byte[] hash;

    Entry(int iterations, byte[] salt, byte[] hash) {
      this.iterations = iterations;
      this.salt = salt;
      this.hash = hash;
    }
  }

  /** The file at {@code path}; IllegalArgumentException naming the line that is not a user. */
  public static PasswordFile read(Path path) throws IOException {
    return parse(Files.readAllLines(path, StandardCharsets.UTF_8));
  }

  static PasswordFile parse(List<String> lines) {
    Map<String, Entry> users = new HashMap<>();
    int number = 0;
    for (String raw : lines) {
      number++;
      String line = raw.strip();
      if (line.isEmpty() || line.startsWith("#")) {
        continue;
      }
      Matcher m = LINE.matcher(line);
      if (!m.matches()) {
        throw new IllegalArgumentException(
            "line " + number + " is not user:" + SCHEME + "$<iterations>$<salt>$<hash>");
      }
      int iterations = Integer.parseInt(m.group(2));
      byte[] salt;
      byte[] hash;
      try {
        salt = Base64.getDecoder().decode(m.group(3));
        hash = Base64.getDecoder().decode(m.group(4));
      } catch (IllegalArgumentException e) {
        throw new IllegalArgumentException("line " + number + ": salt or hash is not base64");
      }
      if (iterations < 1000 || salt.length < 8 || hash.length != HASH_BYTES) {
        throw new IllegalArgumentException(
            "line " + number + ": at least 1000 iterations, 8 bytes of salt and a 32-byte hash");
      }
      if (users.put(m.group(1), new Entry(iterations, salt, hash)) != null) {
        throw new IllegalArgumentException("line " + number + ": user " + m.group(1) + " twice");
      }
    }
    return new PasswordFile(users);
  }

  public int size() {
    return users.size();
  }

  /** Whether {@code password} is {@code user}'s, in time that does not depend on either. */
  public boolean verify(String user, String password) {
    Entry entry = user == null ? null : users.get(user);
    boolean known = entry != null;
    if (!known) {
      entry = NOBODY;
    }
    if (password == null || password.isEmpty()) {
      return false;
    }
    byte[] computed = pbkdf2(password, entry.salt, entry.iterations);
    return MessageDigest.isEqual(computed, entry.hash) && known;
  }

  static byte[] pbkdf2(String password, byte[] salt, int iterations) {
    try {
      PBEKeySpec spec = new PBEKeySpec(password.toCharArray(), salt, iterations, HASH_BYTES * 8);
      return SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256").generateSecret(spec).getEncoded();
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("PBKDF2WithHmacSHA256 is not available", e);
    }
  }

  /**
   * {@code java -cp lakehouse-sql.jar lakehouse.sql.PasswordFile FILE USER}, the password on
   * standard input: exit 0 when it is USER's, 1 when not, 2 when FILE is not a password file.
   * (The tests check what lakehouse sql-passwd writes against what the server reads.)
   */
  public static void main(String[] args) throws IOException {
    if (args.length != 2) {
      System.err.println("usage: PasswordFile FILE USER < password");
      System.exit(2);
    }
    PasswordFile file;
    try {
      file = read(Paths.get(args[0]));
    } catch (IllegalArgumentException e) {
      System.err.println(args[0] + ": " + e.getMessage());
      System.exit(2);
      return;
    }
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String password = in.readLine();
    System.exit(file.verify(args[1], password) ? 0 : 1);
  }
}
