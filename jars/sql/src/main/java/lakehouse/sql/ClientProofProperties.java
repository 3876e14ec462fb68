package lakehouse.sql;

import java.util.Map;
import java.util.Properties;

/**
 * The JVM's system properties, unchangeable by a JDBC client. Hive's session code sets a system
 * property for every {@code set:system:KEY=VALUE} entry a client puts in its connection's
 * configuration (HiveSessionImpl.setVariable), after the login: one could name another login
 * class in {@code hive.server2.custom.authentication.class} (read from the system properties at
 * every login) and let everyone in, or point {@code lakehouse.sql.passwords} elsewhere. Installed
 * in place of the system properties ({@link ReadOnlyGuard#lockSystemProperties()}), this refuses
 * a change made by that code (a frame of HiveSession*'s setVariable or configureSession on the
 * stack), which fails that connection with this message; any other code changes them as
 * before.
 */
final class ClientProofProperties extends Properties {
  private static final long serialVersionUID = 1L;
  static final String CLIENT_SESSION = "org.apache.hive.service.cli.session.HiveSession";
  static final java.util.Set<String> CLIENT_SETTINGS =
      java.util.Set.of("setVariable", "configureSession");
  static final String REFUSED =
      "a JDBC client cannot set the server's Java system properties (set:system:...)";

  ClientProofProperties(Properties current) {
    super();
    for (Map.Entry<Object, Object> e : current.entrySet()) {
      super.put(e.getKey(), e.getValue());
    }
  }

  static boolean fromClientSession() {
    return StackWalker.getInstance()
        .walk(
            frames ->
                frames.anyMatch(
                    f ->
                        f.getClassName().startsWith(CLIENT_SESSION)
                            && CLIENT_SETTINGS.contains(f.getMethodName())));
  }

  private static void refuseClients() {
    if (fromClientSession()) {
      throw new SecurityException(REFUSED);
    }
  }

  @Override
  public synchronized Object setProperty(String key, String value) {
    refuseClients();
    return super.setProperty(key, value);
  }

  @Override
  public synchronized Object put(Object key, Object value) {
    refuseClients();
    return super.put(key, value);
  }

  @Override
  public synchronized void putAll(Map<?, ?> t) {
    refuseClients();
    super.putAll(t);
  }

  @Override
  public synchronized Object remove(Object key) {
    refuseClients();
    return super.remove(key);
  }

  @Override
  public synchronized void clear() {
    refuseClients();
    super.clear();
  }
}
