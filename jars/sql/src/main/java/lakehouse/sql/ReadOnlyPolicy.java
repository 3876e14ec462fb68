package lakehouse.sql;

import java.lang.reflect.Method;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.apache.spark.sql.catalyst.analysis.ResolvedTable;
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LeafNode;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.ScriptTransformation;
import org.apache.spark.sql.execution.command.SetCommand;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2ScanRelation;
import org.apache.spark.sql.internal.SQLConf;
import scala.Option;
import scala.Tuple2;
import scala.collection.Iterator;

/**
 * What a BI client's statement may do on the JDBC server: read the tables and views of the
 * catalog. Two checks, both refusing with a {@link Refusal} that names what is not allowed:
 *
 * <ul>
 *   <li>{@link #checkParsed} on the statement as parsed, before any name is resolved: a table
 *       named by a file path ({@code text.`/etc/passwd`}, {@code delta.`/x`}), a table function
 *       reading a path, and a session whose connection turned SQL on files on or changed a
 *       catalog (a client can set any SQL setting in its connection URL) are refused before a
 *       file is touched;
 *   <li>{@link #checkAnalyzed} on the resolved plan: commands other than SHOW, DESCRIBE,
 *       EXPLAIN, USE and SET of a few settings (so no INSERT, DELETE, UPDATE, MERGE, CREATE,
 *       DROP, ALTER, INSERT OVERWRITE DIRECTORY, ADD JAR, CACHE, ...), script transforms, Java
 *       reflection and file-reading functions, and any relation that is not a table of the
 *       catalog.
 * </ul>
 *
 * <p>Delta reads its transaction log with plans of their own inside a client's query (relations
 * over a {@code DeltaLogFileIndex}, which no SQL statement can build): those pass.
 */
final class ReadOnlyPolicy {
  private ReadOnlyPolicy() {}

  static final String LOGICAL = "org.apache.spark.sql.catalyst.plans.logical.";
  static final String COMMANDS = "org.apache.spark.sql.execution.command.";

  /** Commands that only read the catalog, or only set the session's current namespace. */
  static final Set<String> READ_COMMANDS =
      Set.of(
          LOGICAL + "ShowTables",
          LOGICAL + "ShowTablesExtended",
          LOGICAL + "ShowTablePartition",
          LOGICAL + "ShowViews",
          LOGICAL + "ShowColumns",
          LOGICAL + "ShowCreateTable",
          LOGICAL + "ShowFunctions",
          LOGICAL + "ShowPartitions",
          LOGICAL + "ShowTableProperties",
          LOGICAL + "DescribeRelation",
          LOGICAL + "DescribeColumn",
          LOGICAL + "DescribeNamespace",
          LOGICAL + "DescribeFunction",
          LOGICAL + "SetCatalogAndNamespace",
          COMMANDS + "ShowTablesCommand",
          COMMANDS + "ShowViewsCommand",
          COMMANDS + "ShowColumnsCommand",
          COMMANDS + "ShowCreateTableCommand",
          COMMANDS + "ShowCreateTableAsSerdeCommand",
          COMMANDS + "ShowFunctionsCommand",
          COMMANDS + "ShowPartitionsCommand",
          COMMANDS + "ShowTablePropertiesCommand",
          COMMANDS + "ShowNamespacesCommand",
          COMMANDS + "ShowCatalogsCommand",
          COMMANDS + "ShowCurrentNamespaceCommand",
          COMMANDS + "ShowCollationsCommand",
          COMMANDS + "DescribeTableCommand",
          COMMANDS + "DescribeColumnCommand",
          COMMANDS + "DescribeDatabaseCommand",
          COMMANDS + "DescribeFunctionCommand",
          COMMANDS + "SetNamespaceCommand",
          COMMANDS + "SetCatalogCommand",
          COMMANDS + "ResetCommand",
          COMMANDS + "ExplainCommand");

  /** The settings a client may change with SET (BI tools set the time zone). */
  static final Set<String> SETTABLE =
      Set.of("spark.sql.session.timeZone", "spark.sql.ansi.enabled");

  /** Leaves that read no file and no table: literals, ranges, results of commands run. */
  static final Set<String> SAFE_LEAVES =
      Set.of(
          LOGICAL + "LocalRelation",
          LOGICAL + "OneRowRelation",
          LOGICAL + "Range",
          LOGICAL + "CTERelationRef",
          LOGICAL + "CommandResult",
          LOGICAL + "EmptyRelation",
          "org.apache.spark.sql.catalyst.analysis.ResolvedInlineTable",
          "org.apache.spark.sql.execution.LogicalRDD",
          "org.apache.spark.sql.execution.ExternalRDD",
          "org.apache.spark.sql.execution.columnar.InMemoryRelation");

  /** Plans that write although they are not Commands (before the analyzer turns them into one). */
  static final Set<String> WRITES =
      Set.of(
          "InsertIntoStatement",
          "InsertIntoDir",
          "DeleteFromTable",
          "UpdateTable",
          "MergeIntoTable",
          "DeltaDelete",
          "DeltaUpdateTable",
          "DeltaMergeInto",
          "AppendData",
          "OverwriteByExpression",
          "OverwritePartitionsDynamic",
          "ReplaceData",
          "WriteDelta",
          "WriteFiles");

  /** Functions that run Java code of the caller's choice, or read a file on the server. */
  static final Map<String, String> FUNCTIONS = new TreeMap<>();

  static {
    FUNCTIONS.put(
        "CallMethodViaReflection", "reflect()/java_method() call Java methods on the server");
    FUNCTIONS.put("TryReflect", "try_reflect() calls Java methods on the server");
    FUNCTIONS.put("FromProtobuf", "from_protobuf() reads a descriptor file on the server");
    FUNCTIONS.put("ToProtobuf", "to_protobuf() reads a descriptor file on the server");
    FUNCTIONS.put("FromAvro", "from_avro() is not needed to query the lake");
    FUNCTIONS.put("ToAvro", "to_avro() is not needed to query the lake");
    FUNCTIONS.put("SchemaOfAvro", "schema_of_avro() is not needed to query the lake");
  }

  static final String DELTA_LOG_INDEX = "org.apache.spark.sql.delta.DeltaLogFileIndex";
  static final String DELTA_TABLE = "org.apache.spark.sql.delta.catalog.DeltaTableV2";
  static final String READ_ONLY =
      " is not allowed: this JDBC server is read-only (queries, SHOW, DESCRIBE, EXPLAIN, USE)";
  static final String BY_PATH =
      ": reading files by path is not allowed; query the tables of the catalog"
          + " (SHOW TABLES IN gold)";

  // ---- before resolution ------------------------------------------------------------------

  /**
   * The statement as parsed, in a session whose settings are {@code conf}; {@code catalogs} are
   * the server's own {@code spark.sql.catalog.*} settings.
   */
  static void checkParsed(LogicalPlan plan, SQLConf conf, Map<String, String> catalogs) {
    if (conf.runSQLonFile()) {
      throw new Refusal(
          "this connection turned on spark.sql.runSQLOnFiles: the server reads no file by path;"
              + " connect without it");
    }
    Iterator<Tuple2<String, String>> settings = conf.getAllConfs().iterator();
    while (settings.hasNext()) {
      Tuple2<String, String> kv = settings.next();
      if (kv._1().startsWith("spark.sql.catalog.") && !kv._2().equals(catalogs.get(kv._1()))) {
        throw new Refusal(
            "this connection sets " + kv._1() + ": the server's catalogs are its own;"
                + " connect without it");
      }
    }
    forEachPlan(plan, ReadOnlyPolicy::checkNames, false);
  }

  private static void checkNames(LogicalPlan node) {
    String name = node.getClass().getSimpleName();
    if (name.startsWith("Unresolved")) {
      Object parts = call(node, "multipartIdentifier");
      if (parts instanceof scala.collection.Seq) {
        Iterator<?> it = ((scala.collection.Seq<?>) parts).iterator();
        while (it.hasNext()) {
          String part = String.valueOf(it.next());
          if (part.contains("/") || part.contains("\\")) {
            throw new Refusal(part + BY_PATH);
          }
        }
      }
      Object function = name.equals("UnresolvedTableValuedFunction") ? call(node, "name") : null;
      if (function instanceof scala.collection.Seq) {
        String last = String.valueOf(((scala.collection.Seq<?>) function).last());
        if (last.toLowerCase().contains("by_path")) {
          throw new Refusal(last + "()" + BY_PATH);
        }
      }
    }
  }

  // ---- after resolution --------------------------------------------------------------------

  static void checkAnalyzed(LogicalPlan plan) {
    forEachPlan(plan, ReadOnlyPolicy::checkNode, true);
  }

  /**
   * {@code check} on {@code plan}, its children and the plans of its subqueries. {@code analyzed}:
   * below a read command (SHOW, DESCRIBE) only the table it names is checked, not the catalog's
   * own nodes it resolved to.
   */
  private static void forEachPlan(
      LogicalPlan plan, java.util.function.Consumer<LogicalPlan> check, boolean analyzed) {
    check.accept(plan);
    if (analyzed && isReadCommand(plan)) {
      forEachChild(plan, ReadOnlyPolicy::checkCommandTarget);
      return;
    }
    Iterator<Expression> expressions = plan.expressions().iterator();
    while (expressions.hasNext()) {
      forEachExpression(expressions.next(), check, analyzed);
    }
    Iterator<LogicalPlan> children = plan.children().iterator();
    while (children.hasNext()) {
      forEachPlan(children.next(), check, analyzed);
    }
  }

  private static void forEachChild(LogicalPlan plan, java.util.function.Consumer<LogicalPlan> f) {
    Iterator<LogicalPlan> children = plan.children().iterator();
    while (children.hasNext()) {
      LogicalPlan child = children.next();
      f.accept(child);
      forEachChild(child, f);
    }
  }

  private static void forEachExpression(
      Expression e, java.util.function.Consumer<LogicalPlan> check, boolean analyzed) {
    String name = e.getClass().getSimpleName();
    if (analyzed && FUNCTIONS.containsKey(name)) {
      throw new Refusal(FUNCTIONS.get(name) + ": not allowed on this server");
    }
    if (e instanceof SubqueryExpression) {
      forEachPlan(((SubqueryExpression) e).plan(), check, analyzed);
    }
    Iterator<Expression> children = e.children().iterator();
    while (children.hasNext()) {
      forEachExpression(children.next(), check, analyzed);
    }
  }

  static boolean isReadCommand(LogicalPlan plan) {
    return READ_COMMANDS.contains(plan.getClass().getName());
  }

  private static void checkNode(LogicalPlan node) {
    String name = node.getClass().getSimpleName();
    if (node instanceof ScriptTransformation) {
      throw new Refusal("TRANSFORM ... USING is not allowed: it runs a program on the server");
    }
    if (node instanceof SetCommand) {
      checkSet((SetCommand) node);
      return;
    }
    if (isReadCommand(node)) {
      return;
    }
    if (node instanceof Command || WRITES.contains(name)) {
      throw new Refusal(statement(node) + READ_ONLY);
    }
    if (node instanceof LeafNode) {
      checkLeaf(node);
    }
  }

  private static void checkSet(SetCommand set) {
    Option<Tuple2<String, Option<String>>> kv = set.kv();
    if (kv.isEmpty() || kv.get()._2().isEmpty()) {
      return; // SET, SET -v, SET key: they show settings (Spark redacts secret values)
    }
    String key = kv.get()._1();
    if (!SETTABLE.contains(key)) {
      throw new Refusal(
          "SET " + key + " is not allowed: on this server a connection may set only "
              + String.join(" and ", new java.util.TreeSet<>(SETTABLE)));
    }
  }

  /** A table a SHOW or DESCRIBE names: refused when it is a path (DESCRIBE delta.`/x`). */
  private static void checkCommandTarget(LogicalPlan node) {
    if (node instanceof ResolvedTable) {
      Object table = ((ResolvedTable) node).table();
      if (isPathTable(table)) {
        throw new Refusal(((ResolvedTable) node).identifier().toString() + BY_PATH);
      }
    }
  }

  private static void checkLeaf(LogicalPlan leaf) {
    String cls = leaf.getClass().getName();
    if (SAFE_LEAVES.contains(cls) || leaf instanceof HiveTableRelation) {
      return;
    }
    if (leaf instanceof LogicalRelation) {
      LogicalRelation relation = (LogicalRelation) leaf;
      if (relation.catalogTable().isDefined() || isDeltaLog(relation)) {
        return;
      }
      throw new Refusal(describe(relation) + BY_PATH);
    }
    if (leaf instanceof DataSourceV2Relation) {
      checkV2((DataSourceV2Relation) leaf);
      return;
    }
    if (leaf instanceof DataSourceV2ScanRelation) {
      checkV2(((DataSourceV2ScanRelation) leaf).relation());
      return;
    }
    throw new Refusal(
        "a query reading " + leaf.getClass().getSimpleName() + " is not allowed on this server:"
            + " query the tables of the catalog");
  }

  private static void checkV2(DataSourceV2Relation relation) {
    Object table = relation.table();
    if (table.getClass().getName().equals(DELTA_TABLE) && !isPathTable(table)) {
      return;
    }
    throw new Refusal(relation.table().name() + BY_PATH);
  }

  /** A Delta table named by its path, not by the catalog (DeltaTableV2 without catalogTable). */
  static boolean isPathTable(Object table) {
    if (table == null || !table.getClass().getName().equals(DELTA_TABLE)) {
      return false;
    }
    Object catalogTable = call(table, "catalogTable");
    return !(catalogTable instanceof Option) || ((Option<?>) catalogTable).isEmpty();
  }

  private static boolean isDeltaLog(LogicalRelation relation) {
    return relation.relation() instanceof HadoopFsRelation
        && ((HadoopFsRelation) relation.relation())
            .location()
            .getClass()
            .getName()
            .equals(DELTA_LOG_INDEX);
  }

  private static String describe(LogicalRelation relation) {
    if (relation.relation() instanceof HadoopFsRelation) {
      Object paths = ((HadoopFsRelation) relation.relation()).location().rootPaths();
      if (paths instanceof scala.collection.Seq && ((scala.collection.Seq<?>) paths).nonEmpty()) {
        return ((scala.collection.Seq<?>) paths).mkString(", ");
      }
    }
    return relation.relation().getClass().getSimpleName();
  }

  /** The SQL statement a command or write plan stands for, for the refusal's message. */
  static String statement(LogicalPlan node) {
    return statement(node.getClass().getSimpleName());
  }

  static String statement(String name) {
    String n = name.replaceAll("(Command|Exec|Statement)$", "");
    if (n.startsWith("InsertInto") && (n.contains("Dir"))) {
      return "INSERT OVERWRITE DIRECTORY";
    }
    if (n.startsWith("InsertInto") || n.equals("AppendData") || n.startsWith("Overwrite")
        || n.equals("WriteFiles")) {
      return "INSERT";
    }
    String[][] words = {
      {"Delete", "DELETE"}, {"Update", "UPDATE"}, {"Merge", "MERGE"}, {"Truncate", "TRUNCATE"},
      {"AddJar", "ADD JAR"}, {"AddFile", "ADD FILE"}, {"AddArchive", "ADD ARCHIVE"},
      {"LoadData", "LOAD DATA"}, {"Vacuum", "VACUUM"}, {"Optimize", "OPTIMIZE"},
      {"Restore", "RESTORE"}, {"Clone", "CLONE"}, {"ConvertToDelta", "CONVERT TO DELTA"},
      {"Repair", "MSCK REPAIR TABLE"}, {"Variable", "DECLARE or SET VARIABLE"},
      {"Uncache", "UNCACHE TABLE"}, {"ClearCache", "CLEAR CACHE"}, {"Cache", "CACHE TABLE"},
      {"Refresh", "REFRESH"}, {"Analyze", "ANALYZE TABLE"}, {"Function", "CREATE or DROP FUNCTION"},
      {"Create", "CREATE"}, {"Replace", "CREATE OR REPLACE"}, {"Drop", "DROP"},
      {"Alter", "ALTER"}, {"Rename", "ALTER ... RENAME"}, {"Reorg", "REORG"},
      {"DescribeDelta", "DESCRIBE HISTORY or DETAIL"}, {"DescribeQuery", "DESCRIBE QUERY"},
      {"ExecuteImmediate", "EXECUTE IMMEDIATE"}, {"Call", "CALL"},
    };
    for (String[] w : words) {
      if (n.contains(w[0])) {
        return w[1];
      }
    }
    return n;
  }

  private static Object call(Object target, String method) {
    try {
      Method m = target.getClass().getMethod(method);
      return m.invoke(target);
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
  }
}
