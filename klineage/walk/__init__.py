"""The backward walk of an expert kernel (`walker.walk`) and the feature audit of each step (`audit.audit`)."""
