package topics.jvm;

/**
 * Strict UTF-8 validation, as Python's {@code bytes.decode()} applies it: no overlong
 * forms, no encoded surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
 */
final class Utf8 {
    private Utf8() {}

    private static final long HIGH_BITS = 0x8080808080808080L;

    static boolean valid(byte[] b, int off, int len) {
        int i = off, end = off + len;
        while (i < end) {
            // ASCII runs eight bytes at a time.
            while (i + 8 <= end && (Xxh3.r64(b, i) & HIGH_BITS) == 0) i += 8;
            if (i >= end) break;
            int c = b[i] & 0xFF;
            if (c < 0x80) { i++; continue; }
            int n;
            int min2; // allowed range of the second byte (it narrows for E0, ED, F0, F4)
            int max2 = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) { n = 1; min2 = 0x80; }
            else if (c >= 0xE0 && c <= 0xEF) {
                n = 2;
                min2 = c == 0xE0 ? 0xA0 : 0x80;
                if (c == 0xED) max2 = 0x9F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                n = 3;
                min2 = c == 0xF0 ? 0x90 : 0x80;
                if (c == 0xF4) max2 = 0x8F;
            } else return false;
            if (i + n >= end) return false; // the sequence is cut off by the end
            int c2 = b[i + 1] & 0xFF;
            if (c2 < min2 || c2 > max2) return false;
            for (int k = 2; k <= n; k++) {
                if ((b[i + k] & 0xC0) != 0x80) return false;
            }
            i += n + 1;
        }
        return true;
    }
}
