"""guilds-code: the in-sandbox helper for shell, shell_status, file_read and code_search.

Standard library only (Python >= 3.9); shipped as one script file that
``python3 -I -S FILE ARG`` runs. See protocol.py for the wire format.
"""
