package lakehouse.sql;

import java.util.Collections;
import java.util.Map;
import org.apache.spark.QueryContext;
import org.apache.spark.SparkThrowable;

/**
 * A statement this server does not run. A {@link SparkThrowable}, so that the Thrift server
 * hands the client this message (as {@code Error running query: [LAKEHOUSE_READ_ONLY] ...},
 * SQL state 42501, insufficient privilege) rather than a Java stack trace.
 */
public final class Refusal extends RuntimeException implements SparkThrowable {
  private static final long serialVersionUID = 1L;
  public static final String CONDITION = "LAKEHOUSE_READ_ONLY";
  public static final String SQL_STATE = "42501";

  public Refusal(String message) {
    super(message, null, false, false);
  }

  @Override
  public String getCondition() {
    return CONDITION;
  }

  @Override
  @SuppressWarnings("deprecation")
  public String getErrorClass() {
    return CONDITION;
  }

  @Override
  public String getSqlState() {
    return SQL_STATE;
  }

  @Override
  public boolean isInternalError() {
    return false;
  }

  @Override
  public Map<String, String> getMessageParameters() {
    return Collections.singletonMap("message", getMessage());
  }

  @Override
  public String getDefaultMessageTemplate() {
    return getMessage();
  }

  @Override
  public org.apache.spark.BreakingChangeInfo getBreakingChangeInfo() {
    return null;
  }

  @Override
  public QueryContext[] getQueryContext() {
    return new QueryContext[0];
  }

  /** The message alone: the Thrift server shows a throwable's toString to the client. */
  @Override
  public String toString() {
    return getMessage();
  }
}
