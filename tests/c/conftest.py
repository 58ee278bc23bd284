# guest_agent_test.py is a script run by `make -C guest test` (it needs --agent); pytest over
# tests/ must not collect it.
collect_ignore = ["guest_agent_test.py"]
