from gputrace.cli import main

main()
