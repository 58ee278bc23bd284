"""The `sbx` command line (the console script is `exec_sandbox.cli.main:main`)."""
