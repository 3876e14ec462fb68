package lakehouse.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.AWSBadRequestException;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * Delta's log on S3 with commits any number of writers may race on: each commit file is
 * created with S3's put-if-absent ({@code If-None-Match: *}, Hadoop S3A's conditional create),
 * so of two writers committing one version the store keeps the first and answers the second
 * 412, which this store turns into the {@link FileAlreadyExistsException} Delta's optimistic
 * transaction takes as a conflict: it reads the winner's commit, checks it, and retries at the
 * next version. Delta 4.4's own S3 store ({@code S3SingleDriverLogStore}) checks and writes
 * under a lock of its JVM only, safe for one driver at a time.
 *
 * <p>A PUT retried after a lost answer (S3A and the AWS SDK both retry) may be refused for the
 * object its first attempt created: a refused write reads the object back, and when it holds
 * this write's bytes the write succeeded. The bytes are built before anything is sent, and a
 * write is one PUT at the stream's close: a commit is visible whole or not at all.
 *
 * <p>Configured per scheme with {@code spark.delta.logStore.s3a.impl} (and {@code .s3.impl});
 * it needs a store that honours conditional writes (AWS S3 since 2024, SeaweedFS; a store that
 * ignores the header would let the second writer overwrite the first).
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {

  /** Hadoop's option of createFile() for a conditional create. */
  static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

  public S3ConditionalLogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf)
      throws IOException {
    byte[] bytes = encoded(actions);
    FileSystem fs = path.getFileSystem(conf);
    FSDataOutputStream out =
        overwrite
            ? fs.create(path, true)
            : (FSDataOutputStream)
                fs.createFile(path).overwrite(false).must(CONDITIONAL, true).build();
    try {
      out.write(bytes);
    } catch (Throwable e) {
      abort(out, e);
      throw e;
    }
    try {
      out.close(); // the PUT (with If-None-Match: * unless overwriting)
    } catch (RemoteFileChangedException e) { // 412: the key exists
      refused(fs, path, bytes, e);
    } catch (AWSBadRequestException e) { // 409: another conditional write of it under way
      if (!String.valueOf(e.getMessage()).contains("ConditionalRequestConflict")) {
        throw e;
      }
      refused(fs, path, bytes, e);
    }
  }

  /** Each action on its own line, as Delta's own stores write them. */
  static byte[] encoded(Iterator<String> actions) {
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next()).append('\n');
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }

  /** A refused create: this write's own (its bytes are there), or another writer's. */
  private static void refused(FileSystem fs, Path path, byte[] bytes, IOException cause)
      throws IOException {
    byte[] there;
    try (InputStream in = fs.open(path)) {
      there = in.readAllBytes();
    } catch (IOException e) {
      there = null; // (a 409's winner may not be readable yet: another writer's)
    }
    if (there != null && Arrays.equals(there, bytes)) {
      return;
    }
    FileAlreadyExistsException conflict =
        new FileAlreadyExistsException(path.toString(), null, "written by another writer");
    conflict.initCause(cause);
    throw conflict;
  }

  private static void abort(FSDataOutputStream out, Throwable cause) {
    try {
      out.abort();
    } catch (Throwable e) {
      cause.addSuppressed(e);
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration conf) {
    return false;
  }
}
