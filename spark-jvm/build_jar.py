"""Compile the JVM reader and package its jar (spark-jvm/README.md, "Build").

    python spark-jvm/build_jar.py [OUT_JAR]

`javac --release 17` (lint warnings are errors) against the jars of the pyspark
that this interpreter imports (or the directory in `TOPICS_SPARK_JARS`), then a
zip of the classes and `src/main/resources`. No Maven or Gradle. The default
output is `src/topics/spark/jars/topics-spark-jvm.jar`, where the package finds
it (`topics.spark.jvm.jar_path`); setup.py calls :func:`build` for wheels.

Also compiles the vector checks of `src/test/java` into `spark-jvm/build/test-classes`
when `--checks` is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "src" / "topics" / "spark" / "jars" / "topics-spark-jvm.jar"


def spark_jars() -> Path | None:
    """The directory of Spark's jars to compile against, or None."""
    env = os.environ.get("TOPICS_SPARK_JARS")
    if env:
        return Path(env)
    try:
        import pyspark
    except ImportError:
        return None
    d = Path(pyspark.__file__).parent / "jars"
    return d if d.is_dir() else None


def why_not() -> str | None:
    """Why the jar cannot be built here (None when it can)."""
    if shutil.which("javac") is None:
        return "no javac on PATH (a JDK 17 or newer builds it)"
    if spark_jars() is None:
        return "no pyspark to compile against (install it, or set TOPICS_SPARK_JARS)"
    return None


def _javac(sources: list[Path], classpath: str, out: Path) -> None:
    subprocess.run(
        ["javac", "--release", "17", "-Xlint:all,-serial,-processing,-path,-classfile", "-Werror"]
        + ["-cp", classpath, "-d", str(out), *map(str, sources)],
        check=True,
    )


def build(out_jar: Path = DEFAULT_OUT, *, checks: bool = False) -> Path:
    """Compile and write `out_jar`; returns it. Raises RuntimeError naming what is
    missing, CalledProcessError when javac fails."""
    missing = why_not()
    if missing:
        raise RuntimeError(f"the JVM reader's jar cannot be built: {missing}")
    jars = spark_jars()
    assert jars is not None
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp)
        _javac(sorted((HERE / "src/main/java").rglob("*.java")), f"{jars}/*", classes)
        out_jar.parent.mkdir(parents=True, exist_ok=True)
        part = out_jar.with_suffix(".jar.tmp")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(
                "META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: topics\r\n\r\n"
            )
            for base in (classes, HERE / "src/main/resources"):
                for f in sorted(base.rglob("*")):
                    if f.is_file():
                        z.write(f, f.relative_to(base).as_posix())
        part.replace(out_jar)
        if checks:
            test_out = HERE / "build" / "test-classes"
            shutil.rmtree(test_out, ignore_errors=True)
            test_out.mkdir(parents=True)
            _javac(sorted((HERE / "src/test/java").rglob("*.java")), str(out_jar), test_out)
    return out_jar


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--checks"]
    try:
        out = build(Path(args[0]) if args else DEFAULT_OUT, checks="--checks" in sys.argv)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"javac failed (exit {e.returncode}); its messages are above", file=sys.stderr)
        return 1
    print(f"built {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
