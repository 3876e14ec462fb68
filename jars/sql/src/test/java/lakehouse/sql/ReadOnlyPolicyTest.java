package lakehouse.sql;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/**
 * What a refusal calls the statement it refuses (by the class of the plan Spark or Delta made of
 * it), and the settings a connection may change. Which plans are refused needs a Spark session
 * to build them: tests/test_sql_server.py sends each statement through beeline.
 */
class ReadOnlyPolicyTest {
  @Test
  void refusalsNameTheStatement() {
    String[][] cases = {
      {"DeleteCommand", "DELETE"},
      {"DeltaDelete", "DELETE"},
      {"DeleteFromTable", "DELETE"},
      {"UpdateCommand", "UPDATE"},
      {"MergeIntoCommand", "MERGE"},
      {"InsertIntoHadoopFsRelationCommand", "INSERT"},
      {"InsertIntoStatement", "INSERT"},
      {"AppendData", "INSERT"},
      {"InsertIntoDataSourceDirCommand", "INSERT OVERWRITE DIRECTORY"},
      {"InsertIntoHiveDirCommand", "INSERT OVERWRITE DIRECTORY"},
      {"InsertIntoDir", "INSERT OVERWRITE DIRECTORY"},
      {"CreateDataSourceTableCommand", "CREATE"},
      {"CreateViewCommand", "CREATE"},
      {"CreateTempViewUsing", "CREATE"},
      {"DropTableCommand", "DROP"},
      {"AlterTableAddColumnsCommand", "ALTER"},
      {"TruncateTableCommand", "TRUNCATE"},
      {"AddJarsCommand", "ADD JAR"},
      {"AddFilesCommand", "ADD FILE"},
      {"CacheTableCommand", "CACHE TABLE"},
      {"UncacheTableCommand", "UNCACHE TABLE"},
      {"CreateFunctionCommand", "CREATE or DROP FUNCTION"},
      {"VacuumTableCommand", "VACUUM"},
      {"ConvertToDeltaCommand", "CONVERT TO DELTA"},
      {"CloneTableCommand", "CLONE"},
      {"SetVariable", "DECLARE or SET VARIABLE"},
      {"LoadDataCommand", "LOAD DATA"},
      {"DescribeDeltaHistory", "DESCRIBE HISTORY or DETAIL"},
    };
    for (String[] c : cases) {
      assertEquals(c[1], ReadOnlyPolicy.statement(c[0]), c[0]);
    }
  }

  @Test
  void aConnectionMaySetTheTimeZoneNotSqlOnFiles() {
    assertTrue(ReadOnlyPolicy.SETTABLE.contains("spark.sql.session.timeZone"));
    assertTrue(!ReadOnlyPolicy.SETTABLE.contains("spark.sql.runSQLOnFiles"));
    for (String name : new String[] {"ShowTables", "DescribeRelation", "SetCatalogAndNamespace"}) {
      assertTrue(ReadOnlyPolicy.READ_COMMANDS.contains(ReadOnlyPolicy.LOGICAL + name), name);
    }
    for (String name : ReadOnlyPolicy.READ_COMMANDS) {
      String simple = name.substring(name.lastIndexOf('.') + 1);
      assertTrue(
          simple.startsWith("Show") || simple.startsWith("Describe") || simple.startsWith("Set")
              || simple.equals("ResetCommand") || simple.equals("ExplainCommand"),
          name);
    }
  }
}
