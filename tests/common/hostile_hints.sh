#!/bin/bash
# A hostile hint writer, shared by the tests (tests/common/hostile_hints.rs) and the
# benchmark's `hostile` system (bench/driver/hostile.py), run as another user (uid 65534).
# Usage: hostile_hints.sh HINT_FILE SECONDS ROWS
hints="$1"; seconds="$2"; rows="$3"
end=$((SECONDS + seconds))
# Plans on seven handles: a `plan` line and 100 steps of 16 ranges over every row.
exec 3>"$hints" 4>"$hints" 5>"$hints" 6>"$hints" 7>"$hints" 8>"$hints" 9>"$hints"
wide="rows"; for _ in $(seq 16); do wide="$wide 0 $rows"; done
block=""; for _ in $(seq 100); do block="$block$wide"$'\n'; done
# A step of one range over every row: as wide as one step may be in one range.
whole="rows 0 $rows"; narrow=""; for _ in $(seq 40); do narrow="$narrow$whole"$'\n'; done
# Many handles held open by sleepers, past what one user may hold.
for _ in $(seq 200); do sleep "$seconds" 3>"$hints" 2>/dev/null & done
for fd in 3 4 5 6 7 8 9; do printf 'scdlfs-hints 1\n' >&$fd; done
epoch=0
while [ $SECONDS -lt $end ]; do
  for fd in 3 4 5 6 7 8 9; do
    epoch=$((epoch + 1))
    printf 'plan %d\n%s' "$epoch" "$block" >&$fd 2>/dev/null
    printf 'plan %d\n%s' "$epoch" "$narrow" >&$fd 2>/dev/null
  done
done
wait
