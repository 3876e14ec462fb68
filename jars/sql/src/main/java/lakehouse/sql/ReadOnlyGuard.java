package lakehouse.sql;

import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.parser.ParameterContext;
import org.apache.spark.sql.catalyst.parser.ParseException;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Function1;
import scala.Tuple2;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;
import scala.runtime.BoxedUnit;

/**
 * The JDBC server's read-only guard, a Spark session extension that {@code lakehouse serve-sql}
 * (and nothing else) lists in {@code spark.sql.extensions} after Delta's: every session of the
 * server but the ones it {@link #trust}s (the server's own, which registers the lake's tables)
 * may only read the tables and views of the catalog ({@link ReadOnlyPolicy}). With
 * {@code spark.sql.hive.thriftServer.singleSession=false} each JDBC connection has a session of
 * its own, made by the server with {@code newSession()}: guarded.
 */
public final class ReadOnlyGuard extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  private static final Logger LOG = LoggerFactory.getLogger(ReadOnlyGuard.class);
  private static final Set<SparkSession> TRUSTED =
      Collections.synchronizedSet(Collections.newSetFromMap(new WeakHashMap<>()));
  private static volatile Map<String, String> serverCatalogs;

  /** Lets {@code session} (the server's own) write the catalog: the lake's tables and views. */
  public static void trust(SparkSession session) {
    TRUSTED.add(session);
  }

  static boolean guarded(SparkSession session) {
    return !TRUSTED.contains(session);
  }

  /** Makes the JVM's system properties unchangeable by a JDBC client (ClientProofProperties). */
  public static synchronized void lockSystemProperties() {
    if (!(System.getProperties() instanceof ClientProofProperties)) {
      System.setProperties(new ClientProofProperties(System.getProperties()));
    }
  }

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    // the statement as parsed: Spark's Hive sessions leave out injected hint rules, the
    // analyzer's first batch, and its other batches resolve files before an injected rule runs
    extensions.injectParser(
        new AbstractFunction2<SparkSession, ParserInterface, ParserInterface>() {
          @Override
          public ParserInterface apply(SparkSession session, ParserInterface delegate) {
            return new GuardedParser(session, delegate);
          }
        });
    extensions.injectCheckRule(
        new AbstractFunction1<SparkSession, Function1<LogicalPlan, BoxedUnit>>() {
          @Override
          public Function1<LogicalPlan, BoxedUnit> apply(SparkSession session) {
            return new AnalyzedCheck(session);
          }
        });
    return BoxedUnit.UNIT;
  }

  private static Map<String, String> catalogs(SparkSession session) {
    Map<String, String> known = serverCatalogs;
    if (known == null) {
      known = new HashMap<>();
      SparkConf conf = session.sparkContext().getConf();
      for (Tuple2<String, String> kv : conf.getAll()) {
        if (kv._1().startsWith("spark.sql.catalog.")) {
          known.put(kv._1(), kv._2());
        }
      }
      serverCatalogs = Collections.unmodifiableMap(known);
    }
    return known;
  }

  private static void refused(SparkSession session, Refusal refusal) {
    LOG.warn("refused a statement of a JDBC session: {}", refusal.getMessage());
  }

  /**
   * The session's SQL parser (Delta's, around Spark's), checking each statement it parses
   * before any of its names is resolved: a file is refused before it is touched.
   */
  static final class GuardedParser implements ParserInterface {
    private final SparkSession session;
    private final ParserInterface delegate;

    GuardedParser(SparkSession session, ParserInterface delegate) {
      this.session = session;
      this.delegate = delegate;
    }

    private LogicalPlan checked(LogicalPlan plan) {
      if (guarded(session)) {
        try {
          ReadOnlyPolicy.checkParsed(plan, session.sessionState().conf(), catalogs(session));
        } catch (Refusal r) {
          refused(session, r);
          throw r;
        }
      }
      return plan;
    }

    @Override
    public LogicalPlan parsePlan(String sqlText) throws ParseException {
      return checked(delegate.parsePlan(sqlText));
    }

    @Override
    public LogicalPlan parsePlanWithParameters(String sqlText, ParameterContext parameters)
        throws ParseException {
      return checked(delegate.parsePlanWithParameters(sqlText, parameters));
    }

    @Override
    public LogicalPlan parseQuery(String sqlText) throws ParseException {
      return checked(delegate.parseQuery(sqlText));
    }

    @Override
    public Expression parseExpression(String sqlText) throws ParseException {
      return delegate.parseExpression(sqlText);
    }

    @Override
    public TableIdentifier parseTableIdentifier(String sqlText) throws ParseException {
      return delegate.parseTableIdentifier(sqlText);
    }

    @Override
    public FunctionIdentifier parseFunctionIdentifier(String sqlText) throws ParseException {
      return delegate.parseFunctionIdentifier(sqlText);
    }

    @Override
    public Seq<String> parseMultipartIdentifier(String sqlText) throws ParseException {
      return delegate.parseMultipartIdentifier(sqlText);
    }

    @Override
    public StructType parseRoutineParam(String sqlText) throws ParseException {
      return delegate.parseRoutineParam(sqlText);
    }

    @Override
    public StructType parseTableSchema(String sqlText) throws ParseException {
      return delegate.parseTableSchema(sqlText);
    }

    @Override
    public DataType parseDataType(String sqlText) throws ParseException {
      return delegate.parseDataType(sqlText);
    }
  }

  /** Runs on every resolved plan, after Spark's own checks. */
  static final class AnalyzedCheck extends AbstractFunction1<LogicalPlan, BoxedUnit> {
    private final SparkSession session;

    AnalyzedCheck(SparkSession session) {
      this.session = session;
    }

    @Override
    public BoxedUnit apply(LogicalPlan plan) {
      if (guarded(session)) {
        try {
          ReadOnlyPolicy.checkAnalyzed(plan);
        } catch (Refusal r) {
          refused(session, r);
          throw r;
        }
      }
      return BoxedUnit.UNIT;
    }
  }
}
