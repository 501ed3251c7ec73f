package topics.jvm;

import java.util.Arrays;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A string or binary column whose values are ranges of one byte array: the batch's
 * `.data` bytes as read (or the topic name), not copies of them. The reader allocates a
 * new array per batch, so a value handed out stays valid after the next batch.
 */
final class SliceVector extends ColumnVector {
    private byte[] buf = new byte[0];
    private final int[] at;
    private final int[] len; // -1: null
    private int nulls;

    SliceVector(DataType type, int capacity) {
        super(type);
        at = new int[capacity];
        len = new int[capacity];
    }

    /** Starts a batch whose values lie in `bytes`. */
    void reset(byte[] bytes) {
        buf = bytes;
        nulls = 0;
    }

    void put(int row, int offset, int length) {
        at[row] = offset;
        len[row] = length;
    }

    void putNull(int row) {
        len[row] = -1;
        nulls++;
    }

    @Override
    public boolean hasNull() {
        return nulls > 0;
    }

    @Override
    public int numNulls() {
        return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
        return len[rowId] < 0;
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
        return len[rowId] < 0 ? null : UTF8String.fromBytes(buf, at[rowId], len[rowId]);
    }

    @Override
    public byte[] getBinary(int rowId) {
        return len[rowId] < 0 ? null : Arrays.copyOfRange(buf, at[rowId], at[rowId] + len[rowId]);
    }

    @Override
    public void close() {
        buf = new byte[0];
    }

    private UnsupportedOperationException notText() {
        return new UnsupportedOperationException("a " + type + " column of the topics reader");
    }

    @Override
    public boolean getBoolean(int rowId) {
        throw notText();
    }

    @Override
    public byte getByte(int rowId) {
        throw notText();
    }

    @Override
    public short getShort(int rowId) {
        throw notText();
    }

    @Override
    public int getInt(int rowId) {
        throw notText();
    }

    @Override
    public long getLong(int rowId) {
        throw notText();
    }

    @Override
    public float getFloat(int rowId) {
        throw notText();
    }

    @Override
    public double getDouble(int rowId) {
        throw notText();
    }

    @Override
    public ColumnarArray getArray(int rowId) {
        throw notText();
    }

    @Override
    public ColumnarMap getMap(int ordinal) {
        throw notText();
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
        throw notText();
    }

    @Override
    public ColumnVector getChild(int ordinal) {
        throw notText();
    }
}
