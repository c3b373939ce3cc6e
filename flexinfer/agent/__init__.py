"""flexinfer.agent"""
