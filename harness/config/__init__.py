"""What a run is asked to do, and on what: the plugin's options and the number parsers they use,
whether a run is the harness's at all, the backends, and what a case needs of one."""
