package topics.jvm;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;

/**
 * Checks {@link Utf8#valid} against Python's strict {@code bytes.decode()}: vectors
 * written by utf8_vectors.py, one line per input: "hex-of-input 1|0". Exits 1 on a mismatch.
 */
public final class Utf8Check {
    public static void main(String[] args) throws Exception {
        List<String> lines = Files.readAllLines(Path.of(args[0]));
        int bad = 0;
        for (String line : lines) {
            String[] f = line.split(" ");
            byte[] in = f[0].equals("-") ? new byte[0] : HexFormat.of().parseHex(f[0]);
            boolean want = f[1].equals("1");
            if (Utf8.valid(in, 0, in.length) != want && bad++ < 10) {
                System.out.println("MISMATCH " + f[0] + " python says " + want);
            }
        }
        System.out.println("utf8 vectors: " + lines.size() + " checked, " + bad + " mismatches");
        System.exit(bad == 0 ? 0 : 1);
    }
}
