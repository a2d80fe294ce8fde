"""The `dcp` subcommands (click): thin layers that parse, call the library and print; grouped in
dcp.cli. Nothing below dcp.cli imports this package."""
