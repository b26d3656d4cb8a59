"""The Kubernetes runtime (DESIGN §3): a pod per attempt. Only its parts the token exchange needs so far."""
