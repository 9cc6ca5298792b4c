"""The user's local memory server, which every stdio session and hook of a store attaches to: its private place
and the identity of the code (place), what both sides say first (greeting), the attaching side (attach) and the
server's (server), the stdio entry's relay of bytes (relay), and a small client for hooks and scripts (client).
All but the server need the standard library only."""
