"""medadv: adversarial robustness for medical imaging models."""
