package topics.jvm;

import java.io.EOFException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads one {@link SegmentPartition} as columnar batches of the source schema
 * (topic, seq, ts, tag, node, meta, data).
 *
 * <p>Layout (docs/FORMATS.md, "Segment files"; all integers little-endian):
 * <ul>
 * <li>{@code .idx}: 20 bytes per seq, entry i is seq first_seq + i: offset u32, len u32
 *     (whole frame), ts u64 (ms), flags u8, 3 pad bytes. Flags 0xD5 marks a deleted
 *     record or a hole: such entries are skipped.</li>
 * <li>{@code .data} frame: frame_len u32 (bytes after itself), flags u8, topic_id u64,
 *     seq u64, ts u64, node_len u16, tag_len u16, data_len u32 (37 header bytes),
 *     then node, tag, payload, then XXH3-64 (u64) over every byte after frame_len.
 *     With the has_meta flag the payload is meta_len u32, meta, data.</li>
 * </ul>
 *
 * <p>Every frame read is checked like the Python reader does: it lies inside the file,
 * frame_len matches the indexed length, the three lengths add up, the seq and ts match
 * the entry, the checksum matches, meta_len fits, and node, tag, meta (and data, for
 * the json value format) are UTF-8. The frame's own flags byte, not the `.idx` copy,
 * says whether node, tag and meta are present. Anything else throws
 * {@link FrameCorruptException} naming the topic, the file and the seq.
 */
final class SegmentReader implements PartitionReader<ColumnarBatch> {
    private static final ObjectMapper JSON = new ObjectMapper();
    static final int IDX_ENTRY = 20;
    static final int HDR = 37;
    static final int CRC = 8;
    static final int DELETED = 0xD5;
    static final int F_HAS_TAG = 0x01;
    static final int F_HAS_NODE = 0x02;
    static final int F_HAS_META = 0x08;

    /** Rows per batch, and the most `.data` bytes read in one go (unless one frame is larger). */
    static final int BATCH_ROWS = 4096;
    static final long BATCH_BYTES = 16L << 20;

    private final SegmentPartition p;
    private final boolean json;
    private final byte[] topicUtf8;
    private final FileChannel data;
    private final long dataSize;
    private final String dataPath;
    private final String idxPath;

    // The kept `.idx` entries, in seq order.
    private long[] seqs;
    private long[] offs;
    private int[] lens;
    private long[] tss;
    private int kept;
    private int next; // first kept entry not yet returned

    /** Reads the next batch's `.data` bytes in the background (daemon threads, shared). */
    private static final ExecutorService PREFETCH = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "topics-segment-read-ahead");
        t.setDaemon(true);
        return t;
    });
    private Future<byte[]> ahead;
    private long[] aheadSpan;

    /** The vectors of the batch, in the schema's order. */
    private final ColumnVector[] cols;
    /** seq and ts (null when pruned). */
    private final OnHeapColumnVector seqV, tsV;
    /** topic, tag, node, meta, data (null when pruned): ranges of the batch's bytes. */
    private final SliceVector topicV, tagV, nodeV, metaV, dataV;
    private final ColumnarBatch batch;

    /** The source columns, in schema order. */
    static final String[] COLUMNS = {"topic", "seq", "ts", "tag", "node", "meta", "data"};

    /**
     * @param schema the columns to produce (a subset of the source schema, any order);
     *               every frame is verified whatever the subset
     * @param env    where to ask whether a segment gone from both tiers may be skipped
     */
    SegmentReader(SegmentPartition p, StructType schema, boolean json, PythonEnv env) {
        this.p = p;
        this.json = json;
        this.topicUtf8 = p.topic.getBytes(StandardCharsets.UTF_8);
        String dp = p.dataPath, ip = p.idxPath;
        if (!Files.exists(Path.of(dp)) && p.altDataPath != null && Files.exists(Path.of(p.altDataPath))) {
            // The segment moved to the other tier since planning.
            dp = p.altDataPath;
            ip = p.altIdxPath;
        }
        this.dataPath = dp;
        this.idxPath = ip;
        FileChannel ch = null;
        try {
            readIdx();
            ch = FileChannel.open(Path.of(dp), StandardOpenOption.READ);
        } catch (NoSuchFileException e) {
            // Gone from both tiers since planning: skipped only when the newest snapshot
            // no longer relies on it, as the Python reader decides (docs/SPARK.md, "Errors").
            ObjectNode req = JSON.createObjectNode().put("op", "gone");
            try {
                req.set("slice", JSON.readTree(p.entry));
            } catch (IOException bad) {
                throw new UncheckedIOException(bad);
            }
            Planner.ask(req, env); // throws the SegmentMissing the planner answers
            kept = 0;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        this.data = ch;
        // Every planned frame was written before planning, so the size at open is the
        // one to check them against (taken once, not per batch).
        try {
            this.dataSize = ch == null ? 0 : ch.size();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        ColumnVector[] byName = new ColumnVector[COLUMNS.length];
        cols = new ColumnVector[schema.fields().length];
        for (int i = 0; i < cols.length; i++) {
            StructField f = schema.fields()[i];
            int k = Arrays.asList(COLUMNS).indexOf(f.name());
            cols[i] = k == 1 || k == 2
                ? new OnHeapColumnVector(BATCH_ROWS, f.dataType())
                : new SliceVector(f.dataType(), BATCH_ROWS);
            byName[k] = cols[i];
        }
        topicV = (SliceVector) byName[0];
        seqV = (OnHeapColumnVector) byName[1];
        tsV = (OnHeapColumnVector) byName[2];
        tagV = (SliceVector) byName[3];
        nodeV = (SliceVector) byName[4];
        metaV = (SliceVector) byName[5];
        dataV = (SliceVector) byName[6];
        batch = new ColumnarBatch(cols);
    }

    /** Reads the `.idx` entries of [lo, hi] and keeps the live ones that pass the filters. */
    private void readIdx() throws IOException {
        int count = Math.toIntExact(p.hi - p.lo + 1);
        if (count <= 0) {
            seqs = new long[0];
            return;
        }
        ByteBuffer b = ByteBuffer.allocate(Math.multiplyExact(count, IDX_ENTRY)).order(ByteOrder.LITTLE_ENDIAN);
        long at = (p.lo - p.firstSeq) * IDX_ENTRY;
        try (FileChannel ch = FileChannel.open(Path.of(idxPath), StandardOpenOption.READ)) {
            while (b.hasRemaining()) {
                if (ch.read(b, at + b.position()) < 0) break;
            }
        }
        if (b.hasRemaining()) {
            throw new FrameCorruptException(p.topic, idxPath, p.lo + b.position() / IDX_ENTRY,
                ".idx ends before seq " + p.hi + ", which the snapshot says is checkpointed");
        }
        seqs = new long[count];
        offs = new long[count];
        lens = new int[count];
        tss = new long[count];
        for (int i = 0; i < count; i++) {
            int e = i * IDX_ENTRY;
            long seq = p.lo + i;
            long off = b.getInt(e) & 0xFFFFFFFFL;
            long len = b.getInt(e + 4) & 0xFFFFFFFFL;
            long ts = b.getLong(e + 8);
            int flags = b.get(e + 16) & 0xFF;
            if (flags == DELETED) continue;
            if (p.tsLo != null && ts < p.tsLo) continue;
            if (p.tsHi != null && ts > p.tsHi) continue;
            if (p.keepFromTs != null && ts < p.keepFromTs) continue;
            if (p.deleted.length > 0 && Arrays.binarySearch(p.deleted, seq) >= 0) continue;
            if (len < HDR + CRC || len > Integer.MAX_VALUE) {
                throw new FrameCorruptException(p.topic, dataPath, seq, "frame outside the file");
            }
            seqs[kept] = seq;
            offs[kept] = off;
            lens[kept] = (int) len;
            tss[kept] = ts;
            kept++;
        }
    }

    /** The batch that starts at kept entry `start`: up to BATCH_ROWS entries whose frames
     * span at most BATCH_BYTES (at least one); returns {end, lo, hi} (`.data` bytes [lo, hi)). */
    private long[] span(int start) {
        int end = start + 1;
        long lo = offs[start], hi = offs[start] + lens[start];
        while (end < kept && end - start < BATCH_ROWS) {
            long nlo = Math.min(lo, offs[end]), nhi = Math.max(hi, offs[end] + lens[end]);
            if (nhi - nlo > BATCH_BYTES) break;
            lo = nlo;
            hi = nhi;
            end++;
        }
        return new long[] {end, lo, hi};
    }

    @Override
    public boolean next() throws IOException {
        if (next >= kept) return false;
        // A read ahead, when there is one, is always of the batch that starts at `next`.
        long[] s = ahead != null ? aheadSpan : span(next);
        int end = (int) s[0];
        long lo = s[1];
        byte[] raw = ahead != null ? take(ahead) : readData(next, lo, s[2]);
        ahead = null;
        if (end < kept) {
            // Read the next batch's bytes while this one is decoded (a cold file's I/O
            // overlaps the checksums instead of adding to them).
            long[] n = span(end);
            aheadSpan = n;
            ahead = PREFETCH.submit(() -> readData(end, n[1], n[2]));
        }
        for (ColumnVector c : cols) {
            if (c instanceof SliceVector v) v.reset(v == topicV ? topicUtf8 : raw);
            else ((OnHeapColumnVector) c).reset();
        }
        int rows = 0;
        for (int i = next; i < end; i++) decode(raw, lo, i, rows++);
        batch.setNumRows(rows);
        next = end;
        return true;
    }

    private static byte[] take(Future<byte[]> f) throws IOException {
        try {
            return f.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while reading ahead");
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            if (c instanceof IOException io) throw io;
            if (c instanceof RuntimeException re) throw re;
            throw new IOException(c);
        }
    }

    /** `.data` bytes [lo, hi) for the batch from kept entry `start`; a short file means a
     * frame reaches past its end. */
    private byte[] readData(int start, long lo, long hi) throws IOException {
        long size = dataSize;
        if (hi > size) {
            for (int i = start; i < kept; i++) {
                if (offs[i] + lens[i] > size) {
                    throw new FrameCorruptException(p.topic, dataPath, seqs[i], "frame outside the file");
                }
            }
        }
        byte[] raw = new byte[Math.toIntExact(hi - lo)];
        ByteBuffer b = ByteBuffer.wrap(raw);
        while (b.hasRemaining()) {
            if (data.read(b, lo + b.position()) < 0) throw new EOFException(dataPath);
        }
        return raw;
    }

    private static int u16(byte[] b, int i) {
        return (b[i] & 0xFF) | (b[i + 1] & 0xFF) << 8;
    }

    private void decode(byte[] raw, long base, int i, int row) {
        long seq = seqs[i];
        int o = (int) (offs[i] - base);
        int ln = lens[i];
        if ((Xxh3.r32(raw, o)) != ln - 4) bad(seq, "frame_len does not match the indexed length");
        if (Xxh3.r64(raw, o + 13) != seq) bad(seq, "frame carries another seq");
        int crcAt = o + ln - CRC;
        if (Xxh3.hash(raw, o + 4, ln - 4 - CRC) != Xxh3.r64(raw, crcAt)) bad(seq, "checksum mismatch");
        int flags = raw[o + 4] & 0xFF;
        long ts = Xxh3.r64(raw, o + 21);
        int nl = u16(raw, o + 29);
        int tl = u16(raw, o + 31);
        long dl = Xxh3.r32(raw, o + 33);
        if (nl + tl + dl + HDR + CRC != ln) bad(seq, "lengths inconsistent with frame_len");
        if (ts != tss[i]) {
            throw new FrameCorruptException(p.topic, idxPath, seq, ".idx ts differs from the frame's ts");
        }
        int nodeAt = o + HDR, tagAt = nodeAt + nl, payAt = tagAt + tl;
        int dataAt = payAt, dataLen = (int) dl;

        if (topicV != null) topicV.put(row, 0, topicUtf8.length);
        if (seqV != null) seqV.putLong(row, seq);
        if (tsV != null) tsV.putLong(row, ts * 1000L); // timestamps are µs in Spark, ms on disk
        putText(tagV, row, raw, tagAt, tl, (flags & F_HAS_TAG) != 0, seq, "tag");
        putText(nodeV, row, raw, nodeAt, nl, (flags & F_HAS_NODE) != 0, seq, "node");
        if ((flags & F_HAS_META) != 0) {
            long ml = dl >= 4 ? Xxh3.r32(raw, payAt) : -1;
            if (ml < 0 || ml + 4 > dl) bad(seq, "meta_len inconsistent with data_len");
            putText(metaV, row, raw, payAt + 4, (int) ml, true, seq, "meta");
            dataAt = payAt + 4 + (int) ml;
            dataLen = (int) (dl - 4 - ml);
        } else {
            if (metaV != null) metaV.putNull(row);
        }
        if (json && !Utf8.valid(raw, dataAt, dataLen)) bad(seq, "data not UTF-8");
        if (dataV != null) dataV.put(row, dataAt, dataLen);
    }

    /** Checks a node, tag or meta field and stores it in {@code c} (null: column pruned). */
    private void putText(SliceVector c, int row, byte[] raw, int at, int len, boolean present,
                         long seq, String what) {
        if (!present) {
            if (len != 0) bad(seq, "node/tag length without its flag");
            if (c != null) c.putNull(row);
            return;
        }
        if (!Utf8.valid(raw, at, len)) bad(seq, what + " not UTF-8");
        if (c != null) c.put(row, at, len);
    }

    private void bad(long seq, String why) {
        throw new FrameCorruptException(p.topic, dataPath, seq, why);
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        if (ahead != null) {
            ahead.cancel(false);
            try {
                take(ahead); // let a read in flight finish before its channel closes
            } catch (IOException | RuntimeException ignored) {
                // the read is abandoned; its error does not matter any more
            }
        }
        try {
            if (data != null) data.close();
        } finally {
            batch.close();
        }
    }
}
