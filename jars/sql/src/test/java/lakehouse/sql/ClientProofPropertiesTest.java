package lakehouse.sql;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.Properties;
import org.apache.hive.service.cli.session.HiveSessionImplProbe;
import org.junit.jupiter.api.Test;

class ClientProofPropertiesTest {
  @Test
  void hivesSessionCodeCannotChangeThemTheServerCan() {
    Properties before = new Properties();
    before.setProperty(
        "hive.server2.custom.authentication.class", "lakehouse.sql.PasswordFileAuthenticator");
    ClientProofProperties props = new ClientProofProperties(before);
    assertEquals(
        "lakehouse.sql.PasswordFileAuthenticator",
        props.getProperty("hive.server2.custom.authentication.class"));
    SecurityException refused =
        assertThrows(
            SecurityException.class,
            () ->
                HiveSessionImplProbe.setVariable(
                    props, "hive.server2.custom.authentication.class", "x"));
    assertEquals(ClientProofProperties.REFUSED, refused.getMessage());
    assertThrows(
        SecurityException.class, () -> HiveSessionImplProbe.configureSession(props, "k"));
    // what Hive's session code does otherwise is not a client's setting
    HiveSessionImplProbe.open(props, "hive.session.id", "s1");
    assertEquals("s1", props.getProperty("hive.session.id"));
    assertEquals(
        "lakehouse.sql.PasswordFileAuthenticator",
        props.getProperty("hive.server2.custom.authentication.class"));
    props.setProperty("lakehouse.sql.passwords", "/run/secrets/sql_users");
    assertEquals("/run/secrets/sql_users", props.getProperty("lakehouse.sql.passwords"));
    props.remove("lakehouse.sql.passwords");
    assertNull(props.getProperty("lakehouse.sql.passwords"));
  }
}
