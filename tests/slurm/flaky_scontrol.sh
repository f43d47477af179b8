# Sourced by the batch shell through a profile `setup` line (profile cpu-flaky-scontrol in cluster.toml):
# its `scontrol requeue` fails the first $SFT_SCONTROL_FAILS (default 2) times for this run, as a busy
# controller that times out does, then reaches the real scontrol.
_REAL_SCONTROL="$(type -P scontrol)"

scontrol() {
  if [[ "${1:-}" == requeue ]]; then
    local count_file="$RUN_DIR/logs/scontrol-failures" failed
    failed=$(cat "$count_file" 2>/dev/null || echo 0)
    if ((failed < ${SFT_SCONTROL_FAILS:-2})); then
      echo $((failed + 1)) >"$count_file"
      echo "scontrol: error: Socket timed out on send/recv operation (injected by flaky_scontrol.sh)" >&2
      return 1
    fi
  fi
  "$_REAL_SCONTROL" "$@"
}
