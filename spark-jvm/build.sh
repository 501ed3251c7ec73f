#!/usr/bin/env bash
# Compile the topics-jvm Spark source against pyspark's jars and package
# spark-jvm/build/topics-spark-jvm.jar. No Maven or Gradle: javac and jar only.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-$root/.venv/bin/python}"
jars="$("$py" -c "import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))")"
out="$here/build"
rm -rf "$out/classes" "$out/test-classes"
mkdir -p "$out/classes" "$out/test-classes"
javac --release 17 -Xlint:all,-serial,-processing,-path -Werror -cp "$jars/*" -d "$out/classes" \
    $(find "$here/src/main/java" -name '*.java')
cp -r "$here/src/main/resources/." "$out/classes/"
jar --create --file "$out/topics-spark-jvm.jar" -C "$out/classes" .
javac --release 17 -cp "$out/classes" -d "$out/test-classes" $(find "$here/src/test/java" -name '*.java')
echo "built $out/topics-spark-jvm.jar"
