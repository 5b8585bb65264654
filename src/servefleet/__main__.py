from servefleet.entry.cli import main

main()
