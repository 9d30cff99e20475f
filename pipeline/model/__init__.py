"""The energy-flow model: components and the vectorised flow loop."""

from pipeline.model.energy_flow import EnergyFlowModel, FlowOutput, energy_flow_loss

__all__ = ["EnergyFlowModel", "FlowOutput", "energy_flow_loss"]
