package topics.jvm;

import java.io.Serializable;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One input partition: seqs [lo, hi] (inclusive) of one segment of one topic, as
 * the Python planner's SegmentSlice describes it (src/topics/spark/segments.py).
 * Plain data, serialised to the executors.
 */
public final class SegmentPartition implements InputPartition, Serializable {
    private static final long serialVersionUID = 1L;

    public final String topic;
    public final long firstSeq;
    public final long lo;
    public final long hi;
    public final String dataPath;
    public final String idxPath;
    /** The same segment in the other tier, read when the listed copy is gone; may be null. */
    public final String altDataPath;
    public final String altIdxPath;
    /** Inclusive ms bounds on the `.idx` timestamp, or null for none. */
    public final Long tsLo;
    public final Long tsHi;
    /** Records with a ts below this are expired (TTL); null for none. */
    public final Long keepFromTs;
    /** Seqs deleted per the snapshot whose `.idx` flag may not be written yet (sorted). */
    public final long[] deleted;
    /** The plan entry as the planner wrote it (JSON), handed back to the Python side: to
     * ask whether a segment gone from both tiers may be skipped, or to read it there. */
    public final String entry;

    public SegmentPartition(String topic, long firstSeq, long lo, long hi, String dataPath, String idxPath,
                            String altDataPath, String altIdxPath, Long tsLo, Long tsHi, Long keepFromTs,
                            long[] deleted, String entry) {
        this.topic = topic;
        this.firstSeq = firstSeq;
        this.lo = lo;
        this.hi = hi;
        this.dataPath = dataPath;
        this.idxPath = idxPath;
        this.altDataPath = altDataPath;
        this.altIdxPath = altIdxPath;
        this.tsLo = tsLo;
        this.tsHi = tsHi;
        this.keepFromTs = keepFromTs;
        this.deleted = deleted;
        this.entry = entry;
    }

    /** Whether the listed copy is in an object store, or the listed local copy is gone and
     * the other one is in an object store: read by the Python reader. */
    boolean inObjectStore() {
        if (dataPath.contains("://")) return true;
        return altDataPath != null && altDataPath.contains("://") && !new java.io.File(dataPath).exists();
    }

    @Override
    public String toString() {
        return "SegmentPartition(" + topic + " " + dataPath + " seqs " + lo + ".." + hi + ")";
    }
}
