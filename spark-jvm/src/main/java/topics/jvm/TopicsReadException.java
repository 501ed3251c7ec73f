package topics.jvm;

/** A read the Python planner refused (a segment the snapshot relies on is missing, an
 * unreadable data directory, ...): the message is the planner's, prefixed with its type. */
public final class TopicsReadException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public TopicsReadException(String message) {
        super(message);
    }
}
