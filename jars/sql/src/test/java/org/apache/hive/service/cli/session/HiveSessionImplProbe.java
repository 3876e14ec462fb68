package org.apache.hive.service.cli.session;

import java.util.Properties;

/** Stands in for Hive's HiveSessionImpl (a class of its package) setting a system property. */
public final class HiveSessionImplProbe {
  private HiveSessionImplProbe() {}

  public static void setVariable(Properties system, String key, String value) {
    system.setProperty(key, value);
  }

  public static void configureSession(Properties system, String key) {
    system.remove(key);
  }

  public static void open(Properties system, String key, String value) {
    system.setProperty(key, value);
  }
}
