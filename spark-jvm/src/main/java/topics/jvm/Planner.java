package topics.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;

/**
 * The Python planner, asked over a pipe (docs/SPARK.md, "Two readers").
 *
 * <p>One {@code python -m topics.spark.jvm serve} process per JVM, started on first use
 * and kept while its {@link PythonEnv} stays the same: each request is one JSON line,
 * each answer one JSON line. Without a registered Python source the interpreter is
 * {@link #python()}: {@code spark.pyspark.driver.python}, {@code spark.pyspark.python},
 * then the {@code PYSPARK_DRIVER_PYTHON} and {@code PYSPARK_PYTHON} environment
 * variables, then {@code python3}.
 */
final class Planner {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static Process proc;
    private static BufferedReader answers;
    private static OutputStream requests;
    private static boolean hooked;
    private static PythonEnv running;

    private Planner() {}

    static String python() {
        SparkEnv env = SparkEnv.get();
        SparkConf conf = env == null ? null : env.conf();
        List<String> order = new ArrayList<>();
        if (conf != null) {
            order.add(conf.get("spark.pyspark.driver.python", null));
            order.add(conf.get("spark.pyspark.python", null));
        }
        order.add(System.getenv("PYSPARK_DRIVER_PYTHON"));
        order.add(System.getenv("PYSPARK_PYTHON"));
        for (String p : order) {
            if (p != null && !p.isEmpty()) return p;
        }
        return "python3";
    }

    /** Sends one request to the planner running in `env` (restarted when `env` changed);
     * returns the answer, or throws the error it carries. */
    static synchronized JsonNode ask(ObjectNode request, PythonEnv env) {
        String line;
        try {
            if (proc == null || !proc.isAlive() || !env.equals(running)) start(env);
            requests.write(JSON.writeValueAsBytes(request));
            requests.write('\n');
            requests.flush();
            line = answers.readLine();
        } catch (IOException e) {
            stop();
            throw new IllegalStateException("topics: the Python planner (" + env
                + " -m topics.spark.jvm serve) failed: " + e.getMessage(), e);
        }
        if (line == null) {
            stop();
            throw new IllegalStateException("topics: the Python planner (" + env
                + " -m topics.spark.jvm serve) exited; its stderr is in the driver's log");
        }
        JsonNode ans;
        try {
            ans = JSON.readTree(line);
        } catch (IOException e) {
            throw new IllegalStateException("topics: the Python planner answered " + line, e);
        }
        JsonNode err = ans.path("error");
        if (err.isObject()) {
            String type = err.path("type").asText();
            String msg = err.path("message").asText();
            if ("OptionError".equals(type)) throw new IllegalArgumentException(msg);
            throw new TopicsReadException(type + ": " + msg);
        }
        return ans;
    }

    private static void start(PythonEnv env) throws IOException {
        stop();
        ProcessBuilder pb = env.command("-m", "topics.spark.jvm", "serve");
        pb.redirectError(ProcessBuilder.Redirect.INHERIT);
        proc = pb.start();
        running = env;
        requests = proc.getOutputStream();
        answers = new BufferedReader(new InputStreamReader(proc.getInputStream(), StandardCharsets.UTF_8));
        if (!hooked) {
            Runtime.getRuntime().addShutdownHook(new Thread(Planner::stop));
            hooked = true;
        }
    }

    private static synchronized void stop() {
        if (proc != null) {
            proc.destroy();
            proc = null;
        }
    }
}
