package topics.jvm;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a slice the JVM cannot reach (a segment in an object-store cold tier) with the
 * Python reader, in the same query (docs/SPARK.md, "Two readers"): one
 * {@code python -m topics.spark.jvm read} process per slice, handed the plan entry on
 * stdin, answers an Arrow IPC stream of the source schema on stdout. A non-zero exit
 * fails the task with the process's last stderr lines.
 */
final class PythonSliceReader implements PartitionReader<ColumnarBatch> {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final SegmentPartition p;
    private final Process proc;
    private final File errFile;
    private final BufferAllocator allocator;
    private final ArrowStreamReader reader;
    private final StructType schema;
    private ColumnarBatch batch;

    PythonSliceReader(SegmentPartition p, StructType schema, String valueFormat, PythonEnv env) {
        this.p = p;
        this.schema = schema;
        try {
            errFile = File.createTempFile("topics-read-", ".err");
            ProcessBuilder pb = env.command("-m", "topics.spark.jvm", "read");
            pb.redirectError(errFile);
            proc = pb.start();
            ObjectNode req = JSON.createObjectNode().put("value_format", valueFormat);
            req.set("slice", JSON.readTree(p.entry));
            try (OutputStream in = proc.getOutputStream()) {
                in.write(JSON.writeValueAsBytes(req));
                in.write('\n');
            }
        } catch (IOException e) {
            throw new TopicsReadException("cannot start the Python reader (" + env
                + " -m topics.spark.jvm read) for " + p + ": " + e.getMessage());
        }
        allocator = new RootAllocator(Long.MAX_VALUE);
        reader = new ArrowStreamReader(proc.getInputStream(), allocator);
    }

    @Override
    public boolean next() throws IOException {
        boolean more;
        try {
            more = reader.loadNextBatch();
        } catch (IOException e) {
            fail(e.getMessage());
            throw e;
        }
        if (!more) {
            fail(null);
            return false;
        }
        VectorSchemaRoot root = reader.getVectorSchemaRoot();
        if (batch == null) {
            ColumnVector[] cols = new ColumnVector[schema.fields().length];
            for (int i = 0; i < cols.length; i++) {
                cols[i] = new ArrowColumnVector(root.getVector(schema.fields()[i].name()));
            }
            batch = new ColumnarBatch(cols);
        }
        batch.setNumRows(root.getRowCount());
        return true;
    }

    /** Throws when the process failed; `why` is what the stream reader saw, if anything. */
    private void fail(String why) throws IOException {
        int rc;
        try {
            if (!proc.waitFor(60, TimeUnit.SECONDS)) proc.destroyForcibly();
            rc = proc.waitFor();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while waiting for the Python reader", e);
        }
        if (rc == 0 && why == null) return;
        List<String> lines = Files.readAllLines(errFile.toPath(), StandardCharsets.UTF_8);
        String tail = String.join("\n", lines.subList(Math.max(0, lines.size() - 20), lines.size()));
        throw new TopicsReadException("the Python reader of " + p + " failed (exit " + rc + ")"
            + (why == null ? "" : ": " + why) + "\n" + tail);
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        try {
            reader.close();
            allocator.close();
        } finally {
            proc.destroy();
            Files.deleteIfExists(errFile.toPath());
        }
    }
}
