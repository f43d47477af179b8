# Sourced by the batch shell through a profile `setup` line (profile cpu-container in cluster.toml):
# the training processes get a PATH without any SLURM command, as inside a container image, while
# the batch shell keeps its own PATH (it owns `scontrol requeue`).
TRAIN_BIN="$RUN_DIR/.bin-without-slurm"
mkdir -p "$TRAIN_BIN"
IFS=: read -ra _path_dirs <<<"$PATH"
for _dir in "${_path_dirs[@]}"; do
  for _exe in "$_dir"/*; do
    _name="${_exe##*/}"
    case "$_name" in
      scontrol | srun | sbatch | scancel | squeue | sinfo | sacct | salloc | sattach | sbcast | sstat | sprio | sshare) continue ;;
    esac
    [[ -x "$_exe" && ! -e "$TRAIN_BIN/$_name" ]] && ln -s "$_exe" "$TRAIN_BIN/$_name"
  done
done
_REAL_SRUN="$(type -P srun)"

srun() {  # shadows the template's `srun`: the tasks (and everything they start) see TRAIN_BIN only
  # shellcheck disable=SC2016  # expands on each node
  PATH="$TRAIN_BIN" "$_REAL_SRUN" --nodes="$SLURM_NNODES" --ntasks-per-node=1 \
    bash -c 'echo "$(hostname): scontrol=$(command -v scontrol || echo none)"' >>"$RUN_DIR/path-check.txt"
  if [[ $BASHPID != "$$" ]]; then
    # `srun ... &` runs this function in a subshell whose PID the batch shell signals: become srun
    # (a bare subshell would die of the USR1 meant for srun and orphan it).
    PATH="$TRAIN_BIN" exec "$_REAL_SRUN" "$@"
  fi
  PATH="$TRAIN_BIN" "$_REAL_SRUN" "$@"
}
