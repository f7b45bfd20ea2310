from servescope.cli import main

main()
