package topics.jvm;

import java.io.Serializable;
import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import org.apache.spark.api.python.PythonFunction;
import org.apache.spark.sql.classic.SparkSession;

/**
 * The interpreter and environment variables the Python processes of the JVM reader run
 * with: those Spark gives the Python source registered as {@code topics} (its workers'
 * {@code pythonExec} and {@code envVars}, e.g. the {@code AWS_*} of an object-store cold
 * tier), so the planner and the Python slice reader see what the Python reader would.
 * Made on the driver and shipped to the executors with the reader factory.
 */
final class PythonEnv implements Serializable {
    private static final long serialVersionUID = 1L;

    final String exec;
    final HashMap<String, String> vars;

    PythonEnv(String exec, Map<String, String> vars) {
        this.exec = exec;
        this.vars = new HashMap<>(vars);
    }

    /** From the active session's registered Python source, else {@link Planner#python()}. */
    static PythonEnv ofActiveSession() {
        try {
            PythonFunction f = SparkSession.active().sessionState().dataSourceManager()
                .lookupDataSource(TopicsJvmSource.NAME).dataSourceCls();
            return new PythonEnv(f.pythonExec(), f.envVars());
        } catch (RuntimeException | LinkageError e) {
            // No Python source registered (a JVM-only session), or a Spark whose internals
            // differ from the one this jar was compiled against: Spark's own choice of Python.
            return new PythonEnv(Planner.python(), Map.of());
        }
    }

    ProcessBuilder command(String... args) {
        String[] cmd = new String[args.length + 1];
        cmd[0] = exec;
        System.arraycopy(args, 0, cmd, 1, args.length);
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.environment().putAll(vars);
        return pb;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof PythonEnv e && exec.equals(e.exec) && vars.equals(e.vars);
    }

    @Override
    public int hashCode() {
        return Objects.hash(exec, vars);
    }

    @Override
    public String toString() {
        return exec;
    }
}
