package topics.jvm;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The format {@code topics} on a session that has this jar (docs/SPARK.md, "Two readers").
 *
 * <p>An offline read ({@code option("path", DATA_DIR)}) is read here, by Java tasks, one
 * input partition per segment slice the Python planner lists ({@link Planner}). Every
 * other use of the format (a {@code url} read, a stream, a write) and {@code reader=python} go to the
 * Python source registered under the same name, unchanged. Slices in an object-store cold
 * tier (the JVM has no client for it) are read by the Python reader in the same query
 * ({@link PythonSliceReader}).
 *
 * <p>The schema is the Python source's: topic string, seq long, ts timestamp, tag string,
 * node string, meta string, data string (binary with value format "binary").
 */
public final class TopicsJvmSource implements TableProvider, DataSourceRegister {
    static final String NAME = "topics";
    private static final ObjectMapper JSON = new ObjectMapper();
    private PythonDataSourceV2 python;

    @Override
    public String shortName() {
        return NAME;
    }

    static StructType schema(String valueFormat) {
        return new StructType()
            .add("topic", DataTypes.StringType)
            .add("seq", DataTypes.LongType)
            .add("ts", DataTypes.TimestampType)
            .add("tag", DataTypes.StringType)
            .add("node", DataTypes.StringType)
            .add("meta", DataTypes.StringType)
            .add("data", "binary".equals(valueFormat) ? DataTypes.BinaryType : DataTypes.StringType);
    }

    /** Whether this read is ours; throws for {@code reader=jvm} on a read we cannot do. */
    static boolean readsHere(Map<String, String> options) {
        CaseInsensitiveStringMap o = options instanceof CaseInsensitiveStringMap c ? c : new CaseInsensitiveStringMap(options);
        String reader = o.getOrDefault("reader", "auto").strip().toLowerCase(Locale.ROOT);
        if (!reader.equals("auto") && !reader.equals("jvm") && !reader.equals("python")) {
            throw new IllegalArgumentException("option reader: " + o.get("reader")
                + " is not one of auto, jvm, python");
        }
        if (reader.equals("python")) return false;
        if (o.get("path") != null) return true;
        String why = "it reads data directories (option path), not servers (url), streams or writes";
        if (reader.equals("jvm")) throw new IllegalArgumentException("option reader=jvm: the JVM reader cannot do this read: " + why);
        return false;
    }

    private PythonDataSourceV2 python() {
        if (python == null) {
            python = new PythonDataSourceV2();
            python.setShortName(NAME);
        }
        return python;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        if (!readsHere(options)) return python().inferSchema(options);
        String fmt = options.getOrDefault("valueFormat", "json").strip().toLowerCase(Locale.ROOT);
        if (!fmt.equals("json") && !fmt.equals("binary")) {
            throw new IllegalArgumentException("option valueFormat: " + fmt + " is not one of json, binary");
        }
        return schema(fmt);
    }

    @Override
    public Transform[] inferPartitioning(CaseInsensitiveStringMap options) {
        return readsHere(options) ? new Transform[0] : python().inferPartitioning(options);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        if (!readsHere(properties)) return python().getTable(schema, partitioning, properties);
        List<String> got = new ArrayList<>();
        for (StructField f : schema.fields()) got.add(f.name());
        if (!got.equals(List.of(SegmentReader.COLUMNS))) {
            throw new IllegalArgumentException("the topics source has the fixed schema (" + schema("json").toDDL()
                + "); a user-given schema with columns " + got + " is not supported");
        }
        return new OfflineTable(new CaseInsensitiveStringMap(properties), schema);
    }

    /** An offline read as a table: batch reads only. */
    static final class OfflineTable implements Table, SupportsRead {
        private final CaseInsensitiveStringMap options;
        private final StructType schema;

        OfflineTable(CaseInsensitiveStringMap options, StructType schema) {
            this.options = options;
            this.schema = schema;
        }

        @Override
        public String name() {
            return "topics(" + options.get("path") + ")";
        }

        @Override
        @SuppressWarnings("deprecation")
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            // MICRO_BATCH_READ only to answer a stream over `path` with the source's own
            // message (PlanScan.toMicroBatchStream) rather than Spark's generic one.
            return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap scanOptions) {
            return new OfflineScanBuilder(options, schema);
        }
    }

    /**
     * Column pruning, and filters on topic, seq and ts handed to the planner (which drops
     * segments and `.idx` entries with them). Spark still evaluates every filter on the
     * rows, so a filter the planner reads loosely costs speed, never rows.
     */
    static final class OfflineScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns,
            SupportsPushDownFilters {
        private final CaseInsensitiveStringMap options;
        private StructType required;
        private Filter[] pushed = new Filter[0];
        private final ArrayNode specs = JSON.createArrayNode();

        OfflineScanBuilder(CaseInsensitiveStringMap options, StructType schema) {
            this.options = options;
            this.required = schema;
        }

        @Override
        public void pruneColumns(StructType requiredSchema) {
            StructType kept = new StructType();
            for (StructField f : required.fields()) {
                if (requiredSchema.getFieldIndex(f.name()).isDefined()) kept = kept.add(f);
            }
            required = kept;
        }

        @Override
        public Filter[] pushFilters(Filter[] filters) {
            List<Filter> taken = new ArrayList<>();
            for (Filter f : filters) {
                ObjectNode spec = spec(f);
                if (spec != null) {
                    specs.add(spec);
                    taken.add(f);
                }
            }
            pushed = taken.toArray(new Filter[0]);
            return filters;
        }

        @Override
        public Filter[] pushedFilters() {
            return pushed;
        }

        private static ObjectNode spec(Filter f) {
            String op, col;
            Object value;
            if (f instanceof EqualTo e) { op = "EqualTo"; col = e.attribute(); value = e.value(); }
            else if (f instanceof GreaterThan e) { op = "GreaterThan"; col = e.attribute(); value = e.value(); }
            else if (f instanceof GreaterThanOrEqual e) { op = "GreaterThanOrEqual"; col = e.attribute(); value = e.value(); }
            else if (f instanceof LessThan e) { op = "LessThan"; col = e.attribute(); value = e.value(); }
            else if (f instanceof LessThanOrEqual e) { op = "LessThanOrEqual"; col = e.attribute(); value = e.value(); }
            else if (f instanceof In e) { op = "In"; col = e.attribute(); value = e.values(); }
            else return null;
            if (!col.equals("topic") && !col.equals("seq") && !col.equals("ts")) return null;
            ObjectNode spec = JSON.createObjectNode().put("op", op).put("column", col);
            if (value instanceof Object[] values) {
                ArrayNode arr = spec.putArray("value");
                for (Object v : values) {
                    if (!literal(arr, v)) return null;
                }
            } else {
                ArrayNode one = JSON.createArrayNode();
                if (!literal(one, value)) return null;
                spec.set("value", one.get(0));
            }
            return spec;
        }

        /** Appends `v` as the planner takes it (a ts as µs since the epoch); false if unknown. */
        private static boolean literal(ArrayNode arr, Object v) {
            if (v instanceof String s) arr.add(s);
            else if (v instanceof Long l) arr.add(l);
            else if (v instanceof Integer i) arr.add(i.longValue());
            else if (v instanceof Short s) arr.add(s.longValue());
            else if (v instanceof Byte b) arr.add(b.longValue());
            else if (v instanceof Timestamp t) arr.add(Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000);
            else if (v instanceof Instant t) arr.add(Math.addExact(Math.multiplyExact(t.getEpochSecond(), 1_000_000L), t.getNano() / 1000));
            else return false;
            return true;
        }

        @Override
        public Scan build() {
            ObjectNode req = JSON.createObjectNode().put("op", "plan");
            ObjectNode opts = req.putObject("options");
            for (Map.Entry<String, String> e : options.asCaseSensitiveMap().entrySet()) {
                opts.put(e.getKey(), e.getValue());
            }
            req.set("filters", specs);
            return new PlanScan(req, required, PythonEnv.ofActiveSession());
        }
    }

    /** The scan: planned once, on the driver, when Spark first asks for its partitions. */
    static final class PlanScan implements Scan, Batch {
        private final ObjectNode request;
        private final StructType required;
        private final PythonEnv env;
        private Plan plan;

        PlanScan(ObjectNode request, StructType required, PythonEnv env) {
            this.request = request;
            this.required = required;
            this.env = env;
        }

        private synchronized Plan plan() {
            if (plan == null) plan = Plan.parse(Planner.ask(request, env));
            return plan;
        }

        @Override
        public StructType readSchema() {
            return required;
        }

        @Override
        public String description() {
            return "topics (JVM reader): " + plan().partitions.size() + " segment slices";
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            throw new IllegalArgumentException(
                "streaming reads go through a server: set the option url instead of path");
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return plan().partitions.toArray(new InputPartition[0]);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory(plan().valueFormat, required, env);
        }
    }

    /** Serialised to the executors; makes one columnar reader per partition. */
    static final class ReaderFactory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final String valueFormat;
        private final StructType required;
        private final PythonEnv env;

        ReaderFactory(String valueFormat, StructType required, PythonEnv env) {
            this.valueFormat = valueFormat;
            this.required = required;
            this.env = env;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            SegmentPartition p = (SegmentPartition) partition;
            if (p.inObjectStore()) return new PythonSliceReader(p, required, valueFormat, env);
            return new SegmentReader(p, required, "json".equals(valueFormat), env);
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("the topics JVM reader is columnar only");
        }
    }
}
