# Session REPL driver for bash, started by sbx-agent as the sandbox user (see guest/src/repl.h).
# fd 3: one line per request (the directory holding session-code and session-env); fd 4:
# "<status>\n" back once the code has finished. The code is sourced into this shell, so exported
# variables, the working directory and functions persist. `exit` ends the shell: its status is
# reported and the next request starts a fresh one.
exec {__sbx_control_in}<&3 {__sbx_control_out}>&4 3<&- 4>&-
while IFS= read -r -u "$__sbx_control_in" __sbx_dir; do
	while IFS= read -r -d '' __sbx_var; do
		export "$__sbx_var"
	done <"$__sbx_dir/session-env"
	source "$__sbx_dir/session-code" {__sbx_control_in}<&- {__sbx_control_out}>&-
	printf '%d\n' "$?" >&"$__sbx_control_out"
done
