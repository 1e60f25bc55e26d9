"""The skill library: cards induced from lineages and admitted through the gate."""
