"""resolve: the command line, cluster profile and model preset -> a validated `Launch`, its preflight checks
and its planner input. May import contract and launcher.plan; never execute, commands or ops."""
