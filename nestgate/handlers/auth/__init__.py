"""Sign-in before forwarding: users and passwords, TOTP, sessions in a shared store,
the sign-in portal at /__auth__/, and the dynamic allow-list kept in the same store."""
