package topics.jvm;

import java.util.EnumSet;
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
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The {@code topics-jvm} batch source: reads the segment files a plan lists.
 *
 * <pre>
 * spark.read.format("topics-jvm").option("plan", "/path/plan.json").load()
 * </pre>
 *
 * The plan is made by the Python planner ({@code load_offline} + {@code plan_slices});
 * see {@link Plan} for its shape. The schema is the Python source's
 * ({@code DDL_SCHEMA} in src/topics/spark/segments.py): topic string, seq long,
 * ts timestamp, tag string, node string, meta string, data string (binary with
 * value format "binary"). One input partition per plan entry; reads are columnar.
 */
public final class TopicsJvmSource implements TableProvider, DataSourceRegister {

    @Override
    public String shortName() {
        return "topics-jvm";
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

    private static String planPath(Map<String, String> options) {
        String path = options.get("plan");
        if (path == null) throw new IllegalArgumentException("topics-jvm needs option \"plan\" (a plan JSON file)");
        return path;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return schema(Plan.load(planPath(options)).valueFormat);
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new PlanTable(new CaseInsensitiveStringMap(properties), schema);
    }

    /** The plan as a table: batch reads only. */
    static final class PlanTable implements Table, SupportsRead {
        private final String path;
        private final StructType schema;

        PlanTable(CaseInsensitiveStringMap options, StructType schema) {
            this.path = planPath(options);
            this.schema = schema;
        }

        @Override
        public String name() {
            return "topics-jvm(" + path + ")";
        }

        @Override
        @SuppressWarnings("deprecation")
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return new PlanScanBuilder(path, schema);
        }
    }

    /** Takes the columns the query needs (column pruning); filters are not pushed yet. */
    static final class PlanScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
        private final String path;
        private StructType required;

        PlanScanBuilder(String path, StructType schema) {
            this.path = path;
            this.required = schema;
        }

        @Override
        public void pruneColumns(StructType requiredSchema) {
            // Keep the source's own fields (and their order) that the query asks for.
            StructType kept = new StructType();
            for (StructField f : required.fields()) {
                if (requiredSchema.getFieldIndex(f.name()).isDefined()) kept = kept.add(f);
            }
            required = kept;
        }

        @Override
        public Scan build() {
            return new PlanScan(path, required);
        }
    }

    /** The scan: the plan file is read once, on the driver. */
    static final class PlanScan implements Scan, Batch {
        private final Plan plan;
        private final StructType required;

        PlanScan(String path, StructType required) {
            this.plan = Plan.load(path);
            this.required = required;
        }

        @Override
        public StructType readSchema() {
            return required;
        }

        @Override
        public String description() {
            return "topics-jvm: " + plan.partitions.size() + " segment slices";
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return plan.partitions.toArray(new InputPartition[0]);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory(plan.valueFormat, required);
        }
    }

    /** Serialised to the executors; makes one columnar reader per partition. */
    static final class ReaderFactory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final String valueFormat;
        private final StructType required;

        ReaderFactory(String valueFormat, StructType required) {
            this.valueFormat = valueFormat;
            this.required = required;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new SegmentReader((SegmentPartition) partition, required, "json".equals(valueFormat));
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("topics-jvm reads are columnar only");
        }
    }
}
