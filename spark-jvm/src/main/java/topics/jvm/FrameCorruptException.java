package topics.jvm;

/** A segment frame (or `.idx` entry) that does not verify: names the topic, file and seq. */
public final class FrameCorruptException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public FrameCorruptException(String topic, String path, long seq, String why) {
        super("topic " + topic + ", segment " + path + ", seq " + seq + ": " + why);
    }
}
