package topics.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * A read plan handed over by the Python planner ({@link Planner}, or a JSON file):
 *
 * <pre>
 * {"value_format": "json" | "binary",
 *  "partitions": [{"topic", "first_seq", "lo", "hi", "data_path", "idx_path",
 *                  optional "value_format", "alt_data_path", "alt_idx_path",
 *                  "ts_lo", "ts_hi", "keep_from_ts", "deleted": [seq, ...]}, ...]}
 * </pre>
 *
 * A bare JSON list of partitions is accepted too. The value format is one per read
 * (it decides the type of the `data` column); per-partition values must agree.
 */
public final class Plan {
    public final String valueFormat;
    public final List<SegmentPartition> partitions;

    private Plan(String valueFormat, List<SegmentPartition> partitions) {
        this.valueFormat = valueFormat;
        this.partitions = partitions;
    }

    public static Plan load(String path) {
        JsonNode root;
        try {
            root = new ObjectMapper().readTree(new File(path));
        } catch (IOException e) {
            throw new IllegalArgumentException("cannot read the plan " + path + ": " + e.getMessage(), e);
        }
        return parse(root, path);
    }

    /** The plan in `root`; `path` names it in errors. */
    public static Plan parse(JsonNode root, String path) {
        JsonNode parts = root.isArray() ? root : root.path("partitions");
        if (!parts.isArray()) throw new IllegalArgumentException("plan " + path + " has no \"partitions\" list");
        String fmt = root.isObject() && root.hasNonNull("value_format") ? root.get("value_format").asText() : null;
        List<SegmentPartition> out = new ArrayList<>();
        for (JsonNode p : parts) {
            if (p.hasNonNull("value_format")) {
                String f = p.get("value_format").asText();
                if (fmt != null && !fmt.equals(f)) {
                    throw new IllegalArgumentException("plan " + path + " mixes value formats " + fmt + " and " + f);
                }
                fmt = f;
            }
            long[] deleted = new long[0];
            if (p.has("deleted") && p.get("deleted").isArray()) {
                JsonNode d = p.get("deleted");
                deleted = new long[d.size()];
                for (int i = 0; i < d.size(); i++) deleted[i] = d.get(i).asLong();
                Arrays.sort(deleted);
            }
            out.add(new SegmentPartition(
                req(p, "topic", path).asText(),
                req(p, "first_seq", path).asLong(),
                req(p, "lo", path).asLong(),
                req(p, "hi", path).asLong(),
                req(p, "data_path", path).asText(),
                req(p, "idx_path", path).asText(),
                text(p, "alt_data_path"), text(p, "alt_idx_path"),
                num(p, "ts_lo"), num(p, "ts_hi"), num(p, "keep_from_ts"), deleted,
                p.hasNonNull("data_dir") ? p.toString() : null));
        }
        if (fmt == null) fmt = "json";
        if (!fmt.equals("json") && !fmt.equals("binary")) {
            throw new IllegalArgumentException("value_format must be json or binary, not " + fmt);
        }
        return new Plan(fmt, out);
    }

    private static JsonNode req(JsonNode p, String k, String path) {
        if (!p.hasNonNull(k)) throw new IllegalArgumentException("plan " + path + ": a partition lacks \"" + k + "\"");
        return p.get(k);
    }

    private static String text(JsonNode p, String k) {
        return p.hasNonNull(k) ? p.get(k).asText() : null;
    }

    private static Long num(JsonNode p, String k) {
        return p.hasNonNull(k) ? p.get(k).asLong() : null;
    }
}
