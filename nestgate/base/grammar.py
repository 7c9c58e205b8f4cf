"""Character classes of HTTP's grammar (RFC 9110 5.6.2, 5.1) as byte strings.

They are used with `bytes.translate(None, CLASS)`, which deletes the allowed bytes and
leaves the bad ones: a value is well formed when nothing is left. That is cheaper
than a regular expression for the short values a request carries.
"""

TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# A token in lower case: an HTTP/2 field name (RFC 9113 8.2.1).
LOWER_TCHAR = TCHAR.translate(None, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
VISIBLE = bytes(range(0x21, 0x7F))          # VCHAR: a request target's bytes
