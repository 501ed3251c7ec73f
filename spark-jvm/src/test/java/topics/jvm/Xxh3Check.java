package topics.jvm;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;

/**
 * Checks {@link Xxh3} against vectors written by xxh3_vectors.py (Python's xxhash):
 * one line per input, "hex-of-input hash-as-unsigned-decimal". Exits 1 on any mismatch.
 */
public final class Xxh3Check {
    public static void main(String[] args) throws Exception {
        List<String> lines = Files.readAllLines(Path.of(args[0]));
        int bad = 0;
        for (String line : lines) {
            String[] f = line.split(" ");
            byte[] in = f[0].equals("-") ? new byte[0] : HexFormat.of().parseHex(f[0]);
            long want = Long.parseUnsignedLong(f[1]);
            long got = Xxh3.hash(in);
            if (got != want) {
                if (bad++ < 10) {
                    System.out.println("MISMATCH len=" + in.length + " want=" + Long.toUnsignedString(want)
                        + " got=" + Long.toUnsignedString(got));
                }
            }
        }
        System.out.println("xxh3 vectors: " + lines.size() + " checked, " + bad + " mismatches");
        System.exit(bad == 0 ? 0 : 1);
    }
}
