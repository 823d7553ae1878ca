"""The operating-system helpers every wing uses: starting a process in its own session and ending
its group (processes), opening a file a case body can reach without following a link or blocking
on a pipe (files), the end of a log bounded in lines and bytes (logtail), dropping to the case
user before the build is imported (dropuser: servers and children both).
"""
