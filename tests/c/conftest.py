# guest_agent_test.py and guest_proc_test.py are scripts run by `make -C guest test` (they need
# --agent); pytest over tests/ must not collect them.
collect_ignore = ["guest_agent_test.py", "guest_proc_test.py"]
