package topics.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * A read plan as the Python planner answers it ({@link Planner}; the entries are
 * {@code topics.spark.jvm.slice_entry}, a SegmentSlice's fields):
 *
 * <pre>
 * {"value_format": "json" | "binary",
 *  "partitions": [{"topic", "topic_id", "first_seq", "lo", "hi", "data_path", "idx_path",
 *                  "alt_data_path", "alt_idx_path", "ts_lo", "ts_hi", "keep_from_ts",
 *                  "deleted": [seq, ...], "data_dir", "cold_dir"}, ...]}
 * </pre>
 */
public final class Plan {
    public final String valueFormat;
    public final List<SegmentPartition> partitions;

    private Plan(String valueFormat, List<SegmentPartition> partitions) {
        this.valueFormat = valueFormat;
        this.partitions = partitions;
    }

    /** The plan the planner answered. */
    public static Plan parse(JsonNode root) {
        String fmt = root.path("value_format").asText();
        if (!fmt.equals("json") && !fmt.equals("binary")) {
            throw new IllegalArgumentException("the planner's value_format is " + fmt + ", not json or binary");
        }
        List<SegmentPartition> out = new ArrayList<>();
        for (JsonNode p : root.path("partitions")) {
            JsonNode d = p.path("deleted");
            long[] deleted = new long[d.size()];
            for (int i = 0; i < deleted.length; i++) deleted[i] = d.get(i).asLong();
            Arrays.sort(deleted);
            out.add(new SegmentPartition(
                p.path("topic").asText(),
                p.path("first_seq").asLong(),
                p.path("lo").asLong(),
                p.path("hi").asLong(),
                p.path("data_path").asText(),
                p.path("idx_path").asText(),
                text(p, "alt_data_path"), text(p, "alt_idx_path"),
                num(p, "ts_lo"), num(p, "ts_hi"), num(p, "keep_from_ts"), deleted,
                p.toString()));
        }
        return new Plan(fmt, out);
    }

    private static String text(JsonNode p, String k) {
        return p.hasNonNull(k) ? p.get(k).asText() : null;
    }

    private static Long num(JsonNode p, String k) {
        return p.hasNonNull(k) ? p.get(k).asLong() : null;
    }
}
