# Session REPL driver for bash, started by sbx-agent as the sandbox user (see guest/src/repl.h).
# fd 3: one line per request, "<seq> <token> <nonce> <dir>" (<dir> holds session-code and
# session-env, <dir>/repl/<token>.out and .err are the request's output FIFOs); fd 4:
# "<seq> <nonce> <status>\n" back once the code has finished. A process the code left running
# knows no later request's nonce, so it cannot complete one. The FIFOs are the code's stdout/stderr only while it runs: the
# redirection of the group puts the shell's own (/dev/null) back before the report. The code is sourced into this shell, so exported
# variables, the working directory and functions persist. `exit` ends the shell: its status is
# reported and the next request starts a fresh one.
exec {__sbx_control_in}<&3 {__sbx_control_out}>&4 3<&- 4>&-
# The shell's own stdout/stderr: the group's redirection below restores these after each request.
exec >/dev/null 2>/dev/null
# The agent sends SIGINT when the output passes its limit: end the sourced code (status 130),
# keep the shell and its state.
trap 'return 130 2>/dev/null' INT
# bash writes a line for a job that a signal ended ("line 1:  42 Killed  sleep 9") on its own
# stderr when it notices the job's end, which for a job an earlier request left running is during
# a later one, into that request's result; it writes none for a signal it traps. So every signal
# it would report is trapped, the trap re-raising it: what the signal does to this shell stays
# what it was. Not trapped: INT (above), PIPE and TERM (bash reports neither), ALRM (bash's own
# timers), and those that only stop or are ignored by default. KILL cannot be caught: its trap
# only marks it as handled, which is all that matters here.
for __sbx_sig in HUP QUIT ILL TRAP ABRT BUS FPE USR1 SEGV USR2 STKFLT XCPU XFSZ VTALRM PROF IO \
	PWR SYS $(seq 34 64); do
	trap "trap - $__sbx_sig; kill -$__sbx_sig \$\$" "$__sbx_sig"
done
trap : KILL
while IFS=' ' read -r -u "$__sbx_control_in" __sbx_seq __sbx_token __sbx_nonce __sbx_dir; do
	__sbx_fifo="$__sbx_dir/repl/$__sbx_token"
	# The request is already over when its FIFOs are gone: nobody waits for it.
	[ -p "$__sbx_fifo.out" ] || continue
	{
		while IFS= read -r -d '' __sbx_var; do
			export "$__sbx_var"
		done <"$__sbx_dir/session-env"
		source "$__sbx_dir/session-code" {__sbx_control_in}<&- {__sbx_control_out}>&-
	} >"$__sbx_fifo.out" 2>"$__sbx_fifo.err"
	__sbx_status=$?
	# The agent believes the report only once no fd of this shell is on the FIFOs: copies the
	# code kept (exec 5>&1) write to /dev/null from now on.
	for __sbx_fd in /proc/$$/fd/*; do
		if [[ $__sbx_fd -ef $__sbx_fifo.out || $__sbx_fd -ef $__sbx_fifo.err ]]; then
			eval "exec ${__sbx_fd##*/}>/dev/null"
		fi
	done
	printf '\n%s %s %d\n' "$__sbx_seq" "$__sbx_nonce" "$__sbx_status" >&"$__sbx_control_out"
done
