#!/bin/sh
# hack/fuzz.sh FUZZTIME: fuzzes every fuzz target (each func FuzzX in a _test.go file under
# pkg, internal, cmd) for FUZZTIME, one at a time: go test fuzzes one target per package per
# run. A new interesting input is minimized for at most 2 s (the default 60 s would take a
# short run's whole time). A crasher lands in the package's testdata/fuzz/FuzzX, where it
# stays as a seed once fixed, and fails the run.
#
# Go before 1.27 may end a run with a bare "context deadline exceeded" when -fuzztime expires
# while a worker is mid-input (golang/go#75804): no input failed and none was written. Such
# an ending is reported and passes; any other failure fails.
set -u
fuzztime=${1:-10s}
go=${GO:-go}
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for file in $(grep -rlE '^func Fuzz' --include='*_test.go' pkg internal cmd); do
	for target in $(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/p' "$file"); do
		dir=./$(dirname "$file")
		echo "$target in $dir for $fuzztime"
		if "$go" test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" -fuzzminimizetime 2s "$dir" >"$log" 2>&1; then
			cat "$log"
			continue
		fi
		cat "$log"
		# The flake's whole output: progress lines, then the bare deadline.
		if grep -q '^    context deadline exceeded$' "$log" &&
			[ "$(grep -cvE '^(fuzz: |--- FAIL: Fuzz[A-Za-z0-9_]* \([0-9.]+s\)$|    context deadline exceeded$|FAIL$|FAIL	|exit status [0-9]+$)' "$log")" = 0 ]; then
			echo "$target: ended by -fuzztime mid-input (golang/go#75804), no failing input: passed"
			continue
		fi
		status=1
	done
done
exit $status
