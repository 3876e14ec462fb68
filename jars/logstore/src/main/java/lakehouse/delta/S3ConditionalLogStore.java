package lakehouse.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
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
 * <p>Configured per scheme with {@code spark.delta.logStore.s3a.impl} (and {@code .s3.impl});
 * it needs a store that honours conditional writes (AWS S3 since 2024, SeaweedFS; a store that
 * ignores the header would let the second writer overwrite the first). The write happens at the
 * stream's close, in one PUT: a commit is visible whole or not at all.
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
    FileSystem fs = path.getFileSystem(conf);
    if (overwrite) {
      try (OutputStream out = fs.create(path, true)) {
        writeLines(out, actions);
      }
      return;
    }
    FSDataOutputStream out =
        (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL, true).build();
    try {
      writeLines(out, actions);
    } catch (IOException e) {
      out.abort();
      throw e;
    }
    try {
      out.close(); // the PUT, with If-None-Match: *
    } catch (RemoteFileChangedException e) {
      throw new FileAlreadyExistsException(path.toString(), null, e.getMessage());
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      throw new FileAlreadyExistsException(path.toString(), null, e.getMessage());
    }
  }

  private static void writeLines(OutputStream out, Iterator<String> actions) throws IOException {
    boolean first = true;
    while (actions.hasNext()) {
      if (!first) {
        out.write('\n');
      }
      out.write(actions.next().getBytes(StandardCharsets.UTF_8));
      first = false;
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration conf) {
    return false;
  }
}
