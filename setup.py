"""Build hooks: the compiled parts of the one codec (docs/ARCHITECTURE.md, "Compiled code"),
and the start-up hook that points Spark's Python workers at this interpreter (docs/SPARK.md,
"Which Python the workers run").

Everything else about the distribution lives in pyproject.toml. The extension is
optional: where no C compiler is at hand the build goes on without it, and
`topics.format` falls back to its pure-Python implementation.
"""

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

#: A `.pth` file's `import` line runs when the interpreter starts. Spark starts its
#: Python workers with PYSPARK_PYTHON (else `python3` from PATH, which may lack this
#: package); unless the user chose one, this interpreter is the one that has it.
SPARK_PTH = "topics-spark-python.pth"
SPARK_PTH_LINE = 'import os, sys; os.environ.setdefault("PYSPARK_PYTHON", sys.executable)\n'


#: The JVM reader's jar inside the package (docs/SPARK.md, "Two readers").
SPARK_JAR = os.path.join("topics", "spark", "jars", "topics-spark-jvm.jar")


class BuildWithSparkHook(build_py):
    """build_py that also puts the `.pth` hook at the top of the built tree and, where
    a JDK and pyspark are at hand, compiles the JVM reader's jar into the package."""

    def run(self) -> None:
        super().run()
        os.makedirs(self.build_lib, exist_ok=True)
        with open(os.path.join(self.build_lib, SPARK_PTH), "w") as f:
            f.write(SPARK_PTH_LINE)
        script = os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "spark-jvm", "build_jar.py"
        )
        if not os.path.exists(script):
            return  # building from an sdist made without spark-jvm/
        jar = runpy.run_path(script)
        missing = jar["why_not"]()
        if missing:
            print(f"topics: the JVM reader's jar is left out: {missing}")
            return
        jar["build"](Path(self.build_lib) / SPARK_JAR)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        out = [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, SPARK_PTH)]
        if os.path.exists(os.path.join(self.build_lib, SPARK_JAR)):
            out.append(os.path.join(self.build_lib, SPARK_JAR))
        return out


setup(
    cmdclass={"build_py": BuildWithSparkHook},
    ext_modules=[
        Extension(
            f"topics.format.{name}",
            sources=[f"src/topics/format/{name}.c"],
            include_dirs=["src/topics/format"],
            depends=["src/topics/format/_common.h"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
        for name in ("_render", "_codec")
    ],
)
