from respd.cli import main

main()
