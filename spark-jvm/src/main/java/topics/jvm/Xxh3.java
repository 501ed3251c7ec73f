package topics.jvm;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * XXH3-64 with seed 0 and the default 192-byte secret: the checksum every segment
 * frame ends with (docs/FORMATS.md, "Segment files"; frame.py calls it through
 * {@code xxhash.xxh3_64_intdigest}).
 *
 * <p>Written from the published description of the algorithm. Inputs are split by
 * length into seven cases (0, 1-3, 4-8, 9-16, 17-128, 129-240, and longer); each is
 * a handful of 64-bit multiplies and xor-shifts over little-endian words of the
 * input and of the secret. All arithmetic is unsigned 64-bit, which Java's
 * wrapping {@code long} gives for +, *, ^ and {@code >>>}.
 */
public final class Xxh3 {
    private Xxh3() {}

    private static final long P32_1 = 0x9E3779B1L;
    private static final long P32_2 = 0x85EBCA77L;
    private static final long P32_3 = 0xC2B2AE3DL;
    private static final long P64_1 = 0x9E3779B185EBCA87L;
    private static final long P64_2 = 0xC2B2AE3D27D4EB4FL;
    private static final long P64_3 = 0x165667B19E3779F9L;
    private static final long P64_4 = 0x85EBCA77C2B2AE63L;
    private static final long P64_5 = 0x27D4EB2F165667C5L;
    private static final long MX1 = 0x165667919E3779F9L;
    private static final long MX2 = 0x9FB21C651E98DF25L;

    /** The default secret of the specification (192 bytes of fixed pseudo-random data). */
    private static final byte[] SECRET = bytes(
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
        0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
        0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
        0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
        0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
        0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
        0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
        0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
        0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
        0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
        0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
        0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e);

    private static final int SECRET_SIZE = 192;
    private static final int STRIPE = 64;
    /** Stripes per block before the accumulators are scrambled: (192 - 64) / 8. */
    private static final int STRIPES_PER_BLOCK = (SECRET_SIZE - STRIPE) / 8;
    private static final int BLOCK = STRIPE * STRIPES_PER_BLOCK;

    private static byte[] bytes(int... v) {
        byte[] b = new byte[v.length];
        for (int i = 0; i < v.length; i++) b[i] = (byte) v[i];
        return b;
    }

    private static final VarHandle LE64 = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle LE32 = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

    /** The little-endian u64 at b[i..i+8) (one load: the JIT turns the view into a plain read). */
    static long r64(byte[] b, int i) {
        return (long) LE64.get(b, i);
    }

    /** The little-endian u32 at b[i..i+4), zero-extended. */
    static long r32(byte[] b, int i) {
        return ((int) LE32.get(b, i)) & 0xFFFFFFFFL;
    }

    /** Low half xor high half of the unsigned 128-bit product of a and b. */
    private static long mulFold(long a, long b) {
        long lo = a * b;
        // multiplyHigh is signed; correct it to the unsigned high half.
        long hi = Math.multiplyHigh(a, b) + ((a >> 63) & b) + ((b >> 63) & a);
        return lo ^ hi;
    }

    /** The final mix of the 64-bit XXH64 hash, reused for the shortest inputs. */
    private static long avalanche64(long h) {
        h ^= h >>> 33;
        h *= P64_2;
        h ^= h >>> 29;
        h *= P64_3;
        return h ^ (h >>> 32);
    }

    private static long avalanche(long h) {
        h ^= h >>> 37;
        h *= MX1;
        return h ^ (h >>> 32);
    }

    /** Stronger final mix used for 4-8 byte inputs. */
    private static long rrmxmx(long h, int len) {
        h ^= Long.rotateLeft(h, 49) ^ Long.rotateLeft(h, 24);
        h *= MX2;
        h ^= (h >>> 35) + len;
        h *= MX2;
        return h ^ (h >>> 28);
    }

    /** Mix 16 input bytes at {@code p} with 16 secret bytes at {@code s} (seed 0). */
    private static long mix16(byte[] in, int p, int s) {
        return mulFold(r64(in, p) ^ r64(SECRET, s), r64(in, p + 8) ^ r64(SECRET, s + 8));
    }

    /** XXH3-64 of the whole array. */
    public static long hash(byte[] in) {
        return hash(in, 0, in.length);
    }

    /** XXH3-64 of {@code in[off, off + len)}. */
    public static long hash(byte[] in, int off, int len) {
        if (len <= 16) return small(in, off, len);
        if (len <= 128) return upTo128(in, off, len);
        if (len <= 240) return upTo240(in, off, len);
        return large(in, off, len);
    }

    private static long small(byte[] in, int off, int len) {
        if (len > 8) {
            long lo = r64(in, off) ^ (r64(SECRET, 24) ^ r64(SECRET, 32));
            long hi = r64(in, off + len - 8) ^ (r64(SECRET, 40) ^ r64(SECRET, 48));
            long acc = len + Long.reverseBytes(lo) + hi + mulFold(lo, hi);
            return avalanche(acc);
        }
        if (len >= 4) {
            long first = r32(in, off);
            long last = r32(in, off + len - 4);
            long key = r64(SECRET, 8) ^ r64(SECRET, 16);
            return rrmxmx((last + (first << 32)) ^ key, len);
        }
        if (len > 0) {
            int c1 = in[off] & 0xFF, c2 = in[off + (len >> 1)] & 0xFF, c3 = in[off + len - 1] & 0xFF;
            long combined = ((long) c1 << 16 | (long) c2 << 24 | c3 | (long) len << 8) & 0xFFFFFFFFL;
            long key = (r32(SECRET, 0) ^ r32(SECRET, 4)) & 0xFFFFFFFFL;
            return avalanche64(combined ^ key);
        }
        return avalanche64(r64(SECRET, 56) ^ r64(SECRET, 64));
    }

    /** 17..128 bytes: pairs of 16-byte mixes taken from both ends, moving inward. */
    private static long upTo128(byte[] in, int off, int len) {
        long acc = len * P64_1;
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += mix16(in, off + 48, 96);
                    acc += mix16(in, off + len - 64, 112);
                }
                acc += mix16(in, off + 32, 64);
                acc += mix16(in, off + len - 48, 80);
            }
            acc += mix16(in, off + 16, 32);
            acc += mix16(in, off + len - 32, 48);
        }
        acc += mix16(in, off, 0);
        acc += mix16(in, off + len - 16, 16);
        return avalanche(acc);
    }

    /** 129..240 bytes: the first eight 16-byte rounds, a mix, then the rest at a shifted secret. */
    private static long upTo240(byte[] in, int off, int len) {
        long acc = len * P64_1;
        int rounds = len / 16;
        for (int i = 0; i < 8; i++) acc += mix16(in, off + 16 * i, 16 * i);
        acc = avalanche(acc);
        for (int i = 8; i < rounds; i++) acc += mix16(in, off + 16 * i, 16 * (i - 8) + 3);
        acc += mix16(in, off + len - 16, 136 - 17);
        return avalanche(acc);
    }

    /** One 64-byte stripe into the eight accumulators. */
    private static void stripe(long[] acc, byte[] in, int p, int s) {
        for (int i = 0; i < 8; i++) {
            long v = r64(in, p + 8 * i);
            long k = v ^ r64(SECRET, s + 8 * i);
            acc[i ^ 1] += v;
            acc[i] += (k & 0xFFFFFFFFL) * (k >>> 32);
        }
    }

    /** Longer inputs: blocks of 16 stripes, scrambling the accumulators after each block. */
    private static long large(byte[] in, int off, int len) {
        long[] acc = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
        int blocks = (len - 1) / BLOCK;
        for (int b = 0; b < blocks; b++) {
            int base = off + b * BLOCK;
            for (int n = 0; n < STRIPES_PER_BLOCK; n++) stripe(acc, in, base + n * STRIPE, n * 8);
            int s = SECRET_SIZE - STRIPE;
            for (int i = 0; i < 8; i++) {
                long a = acc[i];
                a ^= a >>> 47;
                a ^= r64(SECRET, s + 8 * i);
                acc[i] = a * P32_1;
            }
        }
        int base = off + blocks * BLOCK;
        int stripes = ((len - 1) - blocks * BLOCK) / STRIPE;
        for (int n = 0; n < stripes; n++) stripe(acc, in, base + n * STRIPE, n * 8);
        // The last 64 bytes always count, against a secret offset of 192 - 64 - 7.
        stripe(acc, in, off + len - STRIPE, SECRET_SIZE - STRIPE - 7);
        long r = len * P64_1;
        for (int i = 0; i < 4; i++) {
            r += mulFold(acc[2 * i] ^ r64(SECRET, 11 + 16 * i), acc[2 * i + 1] ^ r64(SECRET, 11 + 16 * i + 8));
        }
        return avalanche(r);
    }
}
