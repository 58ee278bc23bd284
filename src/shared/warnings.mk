# The one warning list of the three C builds: the extension (setup.py reads SBX_WARNINGS from
# this file), its unit tests and fuzzers (tests/c/Makefile) and the guest agent (guest/Makefile).
# Every warning is an error; each is named, so that a new compiler does not silently add or drop
# some. Exceptions are in the code, scoped and explained (docs/c-conventions.md, Build).
SBX_WARNINGS := -Wall -Wextra -Werror \
	-Wshadow -Wformat=2 -Wformat-security -Wconversion -Wvla -Wimplicit-fallthrough \
	-Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith -Wcast-qual -Wwrite-strings \
	-Wundef -Wnull-dereference -Wold-style-definition -Wswitch-enum \
	-Werror=implicit-function-declaration -Werror=return-type -Werror=incompatible-pointer-types \
	-Werror=int-conversion
