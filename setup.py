"""Build hook for the compiled parts of the one codec (docs/ARCHITECTURE.md, "Compiled code").

Everything else about the distribution lives in pyproject.toml. The extension is
optional: where no C compiler is at hand the build goes on without it, and
`topics.format` falls back to its pure-Python implementation.
"""

from setuptools import Extension, setup

setup(
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
    ]
)
