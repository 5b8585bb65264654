from servefleet.cli import main

main()
